// Wire format of the P2P protocol: ring slots, tokens and the window layout.
// Every rank computes the same layout, so a writer can address a slot in a
// peer's window without asking the peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/p2p.h"

namespace mooncake::pg::p2p {

constexpr int kTokenSeqBits = 48;
constexpr uint64_t kTokenSeqMask = (uint64_t{1} << kTokenSeqBits) - 1;

// Token of slot `seq` of a ring in `epoch` (the pair epoch of the two ranks,
// of which 16 bits are kept). The sequence is stored plus one so that a
// zero-filled window never holds a valid token for sequence 0.
inline uint64_t slotToken(uint64_t epoch, uint64_t seq) {
    return (uint64_t{epoch & 0xffff} << kTokenSeqBits) | ((seq + 1) & kTokenSeqMask);
}

// The ack cursor is a counter, not a slot: zero is the right initial value,
// so it is stored without the +1. A word from another epoch reads as zero.
inline uint64_t cursorWord(uint64_t epoch, uint64_t count) {
    return (uint64_t{epoch & 0xffff} << kTokenSeqBits) | (count & kTokenSeqMask);
}
inline uint64_t cursorCount(uint64_t word, uint64_t epoch) {
    return (word >> kTokenSeqBits) == (epoch & 0xffff) ? (word & kTokenSeqMask) : 0;
}

// What a credit asks of the sender (CreditSlot::kind).
enum CreditKind : uint32_t {
    // "Put chunk [message_offset, +length) of your next message on `tag` at
    // pool_offset of my receive pool for you."
    kCreditData = 0,
    // An any-source recv's reservation: "do you have a message on `tag`?"
    // No data moves; the sender answers with kAckOffer (binding its next
    // message on the tag to recv_id) once it has one. If the receiver picks
    // this sender, data credits with the same recv_id follow.
    kCreditReserve = 1,
    // Withdraws reservation recv_id (another sender won, or the recv gave
    // up): the sender acks it kAckCancelled, answers the reservation with
    // kAckWithdrawn if it had not offered yet, and unbinds its message.
    kCreditCancel = 2,
};

// Granted by the receiver (see CreditKind).
struct CreditSlot {
    uint64_t header;
    uint64_t recv_id;  // same for every credit of one recv
    int32_t tag;
    uint32_t kind;            // CreditKind
    uint64_t pool_offset;     // inside the receiver's pool for this sender
    uint64_t length;          // 0 only for a 0-byte message
    uint64_t message_offset;  // always a multiple of chunk_bytes
    uint64_t message_bytes;   // the recv's size, so the sender can detect a mismatch
    uint64_t footer;
};
static_assert(sizeof(CreditSlot) == 64, "one credit per cache line");

enum AckStatus : uint32_t {
    kAckOk = 0,
    kAckSizeMismatch = 1,  // no data; message_bytes holds the sender's size
    kAckAbandoned = 2,     // the sender gave up on the message (its send failed)
    kAckOffer = 3,         // answers a reservation: message_bytes is the offered message's size
    kAckWithdrawn = 4,     // answers a reservation cancelled before it was offered
    kAckCancelled = 5,     // answers a cancel credit
};

// Written by the sender after the chunk's data: the receiver may read the
// pool chunk of `credit_seq` once it sees this slot.
struct AckSlot {
    uint64_t header;
    uint64_t credit_seq;
    uint64_t length;
    uint64_t message_bytes;  // the send's size, in every ack
    uint32_t status;         // AckStatus
    uint32_t reserved0;
    uint64_t reserved1;
    uint64_t reserved2;
    uint64_t footer;
};
static_assert(sizeof(AckSlot) == 64, "one ack per cache line");

// Offsets (from the window start) of the P2P area of any rank's window. The
// `peer` argument always names the other rank of the pair.
class Layout {
  public:
    static constexpr uint64_t kAlign = 64;

    Layout(int size, const P2POptions& options)
        : base_(options.window_offset),
          ring_(static_cast<uint64_t>(options.ring_slots > 0 ? options.ring_slots : 0)),
          pool_(options.external_pools ? 0 : roundUp(options.pool_bytes_per_peer)),
          stride_(4 * ring_ * kSlotBytes + kAlign + 2 * pool_),
          size_(size > 0 ? static_cast<uint64_t>(size) : 0) {}

    uint64_t bytes() const { return size_ * stride_; }

    // Credits `peer` grants this rank (this rank sends to `peer`).
    uint64_t creditIn(int peer, uint64_t seq) const { return ringSlot(peer, 0, seq); }
    // Acks for chunks `peer` sent to this rank.
    uint64_t ackIn(int peer, uint64_t seq) const { return ringSlot(peer, 1, seq); }
    // Local copies of the credits/acks this rank writes to `peer`: a put may
    // read its source late, so the source must outlive the put.
    uint64_t creditOut(int peer, uint64_t seq) const { return ringSlot(peer, 2, seq); }
    uint64_t ackOut(int peer, uint64_t seq) const { return ringSlot(peer, 3, seq); }
    // How many of this rank's acks `peer` has consumed (written by `peer`).
    uint64_t cursor(int peer) const { return block(peer) + 4 * ring_ * kSlotBytes; }
    // Chunks `peer` sends to this rank land here (not with external pools).
    uint64_t recvPool(int peer) const { return cursor(peer) + kAlign; }
    // This rank's staging copy of the data it sends to `peer`.
    uint64_t sendPool(int peer) const { return recvPool(peer) + pool_; }

  private:
    static constexpr uint64_t kSlotBytes = 64;
    static uint64_t roundUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
    uint64_t block(int peer) const { return base_ + static_cast<uint64_t>(peer) * stride_; }
    uint64_t ringSlot(int peer, int ring, uint64_t seq) const {
        return block(peer) + (static_cast<uint64_t>(ring) * ring_ + seq % ring_) * kSlotBytes;
    }

    uint64_t base_;
    uint64_t ring_;
    uint64_t pool_;
    uint64_t stride_;
    uint64_t size_;
};

// Accepts the slot at `offset` of the local window only when its footer and
// header both equal `token`. The footer is read first, with acquire: it is
// written last (putFlag), so a matching footer means the body has landed.
template <typename Slot>
bool readSlot(const uint8_t* window, uint64_t offset, uint64_t token, Slot* out) {
    if (loadFlag(window, offset + offsetof(Slot, footer)) != token)
        return false;
    std::memcpy(static_cast<void*>(out), window + offset, sizeof(Slot));
    return out->header == token && out->footer == token;
}

// Writes `slot` to `peer`'s window: the body with put (from `outbox`, local
// memory that stays untouched until the peer has consumed the slot), then the
// footer with putFlag so it becomes visible only after the body.
template <typename Slot>
Status writeSlot(Fabric& fabric, int peer, uint64_t remote_offset, uint8_t* outbox,
                 const Slot& slot, Deadline deadline) {
    constexpr size_t kBody = offsetof(Slot, footer);
    static_assert(kBody + sizeof(uint64_t) == sizeof(Slot), "footer must be the last word");
    std::memcpy(outbox, &slot, sizeof(Slot));
    MC_RETURN_IF_ERROR(fabric.put(peer, remote_offset, outbox, kBody, deadline));
    return fabric.putFlag(peer, remote_offset + kBody, slot.footer, deadline);
}

}  // namespace mooncake::pg::p2p
