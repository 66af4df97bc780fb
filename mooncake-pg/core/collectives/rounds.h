// The round protocol every collective is built from.
//
// Collective area of a window (at CommOptions::window_offset), N = group size:
//   data flag [s]   N x 64 B   written by sender s: token of its last message
//   ack flag  [r]   N x 64 B   written by receiver r: token of the last message
//                              from this window's owner that r consumed
//   abort flag [s]  N x 64 B   written by sender s: an abort notice (below)
//   slots [s][k]    N x 2 x (128 B header + chunk payload), written by sender s
//
// A rank's own slots in its own window (s = itself) are never written by
// peers; it uses them to *publish* data: peers that map its window (same
// host) read a published piece in place instead of receiving a copy, so data
// meant for every peer is copied once rather than once per peer. A piece
// published in round R lives in own slot R % 2 and is read by the peers
// during round R; the slot is rewritten no earlier than the end of round
// R + 1, when every peer has finished round R (it sent its round R + 1
// message). That holds among the members of one epoch only: a member that
// the next view drops may still be copying round R's piece when the others,
// in the new epoch, publish again (they wait for the new members alone). So
// every publish first stamps its round's token into the slot's header, and a
// reader checks the stamp after its copy: a changed stamp fails the call
// (kAborted) instead of passing off the next epoch's data as this round's.
//
// A round is full mesh among the active ranks: each sends one message (header
// plus 0..chunk bytes) to every other one in slot round % 2 of its own area at
// the receiver and then raises its data flag there; after consuming, the
// receiver writes its ack flag into the sender's window. A sender reuses a
// slot only after the ack of the message that was in it. Because every pair
// exchanges a message in every round, all ranks' round counters advance in
// lockstep, and a flag value (epoch << 48 | round) identifies one message.
//
// The first round of every call carries the call's description in the
// header; every rank checks every header against its own call before it
// consumes any payload, so disagreeing ranks all fail the same call and stay
// in step.
//
// Abort notices. A rank whose call fails writes a notice naming the culprit
// into every member's abort line, so members blocked on *it* (not on the
// culprit) fail at once with the same blame; waiters watch only the peer they
// wait on plus these lines, so a member that exits right after finishing its
// part of a call, which nobody waits on any more, fails nobody. A rank that
// applies a view which drops a member writes that member a "removed" notice
// of the new epoch, so a call it is still inside fails instead of waiting for
// peers that moved on; it ends only a wait on that sender, so a call the
// senders completed before moving on completes on the dropped member too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/types.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::coll {

constexpr size_t kLineBytes = 64;
constexpr size_t kHeaderBytes = 128;
constexpr int kRoundBits = 48;
// Tokens carry the membership epoch modulo 2^16 (kEpochMask): epochs wrap,
// so tokens are ordered as serial numbers (tokenAtLeast), and at every epoch
// change a rank clears the flags of older epochs from its window
// (Communicator::setMembership). A flag then only ever holds a token of the
// current epoch, of the one before it, or the new epoch's floor.
constexpr uint64_t kEpochMask = (uint64_t{1} << (64 - kRoundBits)) - 1;

// Rounds of an epoch count from 1: a zeroed window (flag 0) then never looks
// like a message of epoch 0.
constexpr uint64_t kFirstRound = 1;

inline uint64_t makeToken(uint32_t epoch, uint64_t round) {
    return ((epoch & kEpochMask) << kRoundBits) | round;
}
// Below every token of `epoch` and above every token of older epochs: what a
// rank acknowledges to its peers when it leaves older epochs behind (for
// epoch 0 after a wrap: all ones, the last token of epoch 65535).
inline uint64_t epochFloor(uint32_t epoch) {
    return ((epoch & kEpochMask) << kRoundBits) - 1;
}
// Epochs up to this far past a token's are later ones, the rest of the 2^16
// earlier ones: a rank is never that far behind its peers, and flags left
// from more than 2^16 - kEpochsAhead epochs ago must not read as current.
constexpr uint16_t kEpochsAhead = 1 << 14;
// Whether flag value `v` is `want` or a later token (epochs compared modulo
// 2^16 as above). 0 is an untouched flag, never a token.
inline bool tokenAtLeast(uint64_t v, uint64_t want) {
    const auto ahead = static_cast<uint16_t>((v >> kRoundBits) - (want >> kRoundBits));
    if (v == 0 || ahead >= kEpochsAhead)
        return false;
    return ahead != 0 || v >= want;
}

// Payload bytes of one slot: CommOptions::chunk_bytes rounded up to whole
// cache lines (at least one), so slots stay line aligned.
size_t slotPayloadBytes(const CommOptions& options);

struct Layout {
    uint64_t base = 0;
    int size = 0;
    size_t chunk = 0;

    uint64_t dataFlag(int sender) const { return base + kLineBytes * sender; }
    uint64_t ackFlag(int receiver) const { return base + kLineBytes * (size + receiver); }
    uint64_t abortFlag(int sender) const { return base + kLineBytes * (2 * size + sender); }
    uint64_t slot(int sender, int k) const {
        return base + kLineBytes * kFlagLines * size +
               (2 * static_cast<uint64_t>(sender) + k) * (kHeaderBytes + chunk);
    }
    static size_t bytes(int size, size_t chunk) {
        return kLineBytes * kFlagLines * size +
               2 * static_cast<size_t>(size) * (kHeaderBytes + chunk);
    }
    // Data, ack and abort flag lines per rank.
    static constexpr size_t kFlagLines = 3;
};

// An abort notice in one 8-byte flag: epoch (16 bits) | reason (8) | unused
// (8) | culprit + 1 (32; 0 = no culprit). The reason is the StatusCode of the
// sender's failure, or kRemovedReason. Notices of epochs older than the
// reader's are stale and ignored; a zero flag is no notice.
constexpr uint8_t kRemovedReason = 0xff;
struct AbortNotice {
    uint32_t epoch = 0;
    uint8_t reason = 0;
    int culprit = -1;
};
inline uint64_t encodeAbortNotice(uint32_t epoch, uint8_t reason, int culprit) {
    return ((epoch & kEpochMask) << kRoundBits) | (static_cast<uint64_t>(reason) << 40) |
           static_cast<uint32_t>(culprit + 1);
}
inline AbortNotice decodeAbortNotice(uint64_t v) {
    return AbortNotice{static_cast<uint32_t>(v >> kRoundBits), static_cast<uint8_t>(v >> 40),
                       static_cast<int>(static_cast<uint32_t>(v)) - 1};
}
// Whether `v` is a notice that concerns a reader in `epoch`.
inline bool abortNoticeApplies(uint64_t v, uint32_t epoch) {
    const auto ahead = static_cast<uint16_t>((v >> kRoundBits) - epoch);
    return v != 0 && ahead < kEpochsAhead;
}

enum class OpKind : uint8_t {
    kAllReduce = 1,
    kBroadcast,
    kReduce,
    kAllGather,
    kReduceScatter,
    kAllToAllV,
    kGather,
    kScatter,
    kBarrier,
};
const char* opKindName(OpKind kind);

// What a rank says about its call in round 0.
struct CallDesc {
    OpKind kind = OpKind::kBarrier;
    DataType dtype = DataType::kUInt8;
    ReduceOp op = ReduceOp::kSum;
    int32_t root = -1;
    // Element count, or bytes for byte-oriented calls; unused by all-to-all-v.
    uint64_t count = 0;
    // all-to-all-v only: this rank's send/recv byte counts per rank.
    const std::vector<size_t>* send_bytes = nullptr;
    const std::vector<size_t>* recv_bytes = nullptr;
    // Opaque description of the caller's buffers (the torch layer hashes
    // dtype and shape); 0 = not given. Ranks must agree on it.
    uint64_t signature = 0;
    // This rank failed the call before the exchange (Rounds::failTogether);
    // the other fields past `kind` carry nothing.
    bool failed_locally = false;
};

// Header flags of round 0.
constexpr uint8_t kReadsYourWindow = 1;   // the sender maps the receiver's window
constexpr uint8_t kReadsEveryWindow = 2;  // the sender maps every member's window
// The sender failed its call before the exchange: its payload is the error
// text and `failed_code` its StatusCode.
constexpr uint8_t kFailedLocally = 4;

struct MsgHeader {
    uint64_t token;
    uint32_t payload_bytes;    // in this slot
    uint32_t published_bytes;  // published in the sender's own window
    // The rest describes the call; it is filled in round 0 only.
    uint32_t seq;
    uint8_t kind;
    uint8_t dtype;
    uint8_t op;
    uint8_t flags;
    int32_t root;
    uint32_t chunk_bytes;
    uint32_t one_shot_max;
    uint32_t failed_code;  // with kFailedLocally
    uint64_t count;        // all-to-all-v: bytes the sender expects from the receiver
    uint64_t pair_bytes;   // all-to-all-v: bytes the sender sends to the receiver
    uint64_t max_bytes;    // all-to-all-v: most bytes the sender sends to any peer
    uint64_t digest;       // all-to-all-v: see checkCallHeaders
    uint64_t signature;    // CallDesc::signature
    uint8_t padding[kHeaderBytes - 80];
};
static_assert(sizeof(MsgHeader) == kHeaderBytes);

// Per-Communicator protocol state that outlives one call.
struct CommState {
    Fabric* fabric = nullptr;
    int rank = 0;
    int size = 0;
    Layout layout;
    size_t one_shot_max = 0;
    int reduce_threads = 0;  // CommOptions::reduce_threads
    std::vector<uint8_t> active;
    std::vector<int> members;      // active ranks, ascending
    int index = -1;                // this rank's position in `members`, -1 if inactive
    uint32_t epoch = 0;            // the token epoch: view_epoch modulo 2^16
    uint64_t view_epoch = 0;       // as given to setMembership, never wraps
    uint64_t round = kFirstRound;  // the next round of this epoch
    uint32_t seq = 0;              // calls started in this epoch
    // Set when a call failed mid-way: the ranks are out of step until the
    // next epoch.
    std::string broken;
    CollectiveFailure failure;
    // By rank: whether that peer reads this rank's window in place, as it
    // said in its last round-0 header of this epoch (unknown counts as no).
    std::vector<uint8_t> read_in_place;
    // Working storage of the current call, kept between calls so that small
    // calls allocate nothing.
    struct Scratch {
        std::vector<uint8_t> sent;
        std::vector<const uint8_t*> payload;
        std::vector<size_t> payload_bytes;
        std::vector<const uint8_t*> published;
        std::vector<size_t> published_bytes;
        std::vector<MsgHeader> headers;
        std::vector<const void*> inputs;
    } scratch;
};

// One call's sequence of rounds. Usage per round: send() to the peers that
// get payload, receiveAll() (header-only messages go to the rest), read what
// arrived, finishRound(). Any error other than kInvalidArgument from round 0
// leaves the ranks out of step and marks the state broken.
class Rounds {
public:
    Rounds(CommState& state, const CallDesc& call, Deadline deadline);
    ~Rounds();

    int rank() const { return state_.rank; }
    int size() const { return state_.size; }
    const std::vector<int>& members() const { return state_.members; }
    int memberCount() const { return static_cast<int>(state_.members.size()); }
    int index() const { return state_.index; }
    size_t chunk() const { return state_.layout.chunk; }
    size_t oneShotMax() const { return state_.one_shot_max; }

    // This round's message to `peer`: a then b (together <= chunk()) copied
    // into the peer's slot, plus `published` bytes (<= chunk()) that the
    // peer reads from publishArea(); only for a peer that readsInPlace().
    Status send(int peer, const void* a, size_t a_len, const void* b = nullptr, size_t b_len = 0,
                size_t published = 0);
    // Sends the same `len` bytes to every other member except `skip`:
    // published once for the peers that read in place, copied to the rest.
    Status sendToAll(const void* data, size_t len, int skip = -1);
    // Completes the sends of the round and waits for every member's message.
    // In round 0 every header is checked first; a mismatch finishes the round
    // and returns kInvalidArgument on every rank.
    Status receiveAll();
    // Acknowledges every message of the round and moves to the next one.
    Status finishRound();
    // For a call that this rank failed before its round 0 (a local argument
    // check): runs round 0 with the error text as the payload, so every
    // member fails the same call with the same error and the ranks stay in
    // step. Returns that error (from the lowest failing member), or the
    // exchange's own failure.
    Status failTogether(const Status& local);

    // What arrived from `peer` this round: the copied and the published part.
    const uint8_t* payload(int peer) const { return payload_[peer]; }
    size_t payloadBytes(int peer) const { return payload_bytes_[peer]; }
    const uint8_t* published(int peer) const { return published_[peer]; }
    size_t publishedBytes(int peer) const { return published_bytes_[peer]; }
    // Whichever part a sendToAll() used.
    const uint8_t* data(int peer) const {
        return published_bytes_[peer] != 0 ? published_[peer] : payload_[peer];
    }
    // kInternal unless `peer` sent exactly these byte counts this round.
    Status expectBytes(int peer, size_t payload, size_t published = 0);
    // kInternal unless a sendToAll() from `peer` carried exactly `bytes`.
    Status expectData(int peer, size_t bytes);

    // Whether `peer` reads this rank's window in place (learnt in round 0 of
    // an earlier call of this epoch, or of this call once it is received).
    bool readsInPlace(int peer) const { return state_.read_in_place[peer] != 0; }
    // After round 0: whether every member maps every other member's window.
    bool everyoneReadsInPlace() const { return everyone_in_place_; }
    // chunk() bytes of this rank's own window that the peers may read during
    // this round (publishArea) or the next one (nextPublishArea). Also free
    // scratch when nothing is published from it.
    uint8_t* publishArea() { return stampedSlot(state_.round); }
    uint8_t* nextPublishArea() { return stampedSlot(state_.round + 1); }

    // Threads for this call's large element-wise steps (core/reduce_pool.h):
    // CommOptions::reduce_threads, MC_PG_REDUCE_THREADS or cores / members
    // whose windows this rank maps (the ranks of the group on this host).
    int stepThreads() const;

    // Room for one input pointer per member (for reduceInto).
    std::vector<const void*>& inputs() { return inputs_; }
    // Largest MsgHeader::max_bytes announced in round 0 (all-to-all-v).
    uint64_t maxAnnouncedBytes() const { return max_announced_; }

private:
    MsgHeader headerFor(int peer, size_t payload_bytes, size_t published) const;
    // Own slot `round % 2`, its header stamped with round's token (above).
    uint8_t* stampedSlot(uint64_t round);
    // After the reads of a round: fails the call if a peer whose published
    // piece was read in place has restamped that slot meanwhile.
    Status checkPublishedIntact();
    Status waitAtLeast(int peer, uint64_t offset, uint64_t want, uint64_t* seen);
    // Whether the flag at `offset` reads at least `want` now (into *value).
    bool arrivedSince(uint64_t offset, uint64_t want, uint64_t* value) const;
    Status fail(int peer, const Status& status);
    // fail() without telling the other members (for failures they learnt
    // about themselves or from the same notice).
    Status failQuietly(int peer, const Status& status);
    // The member whose abort notice ends a wait on `awaited` (-1: none):
    // any failure notice of this epoch, or a newer epoch's removed notice
    // from `awaited` itself.
    int noticeFrom(int awaited) const;
    // That notice as a failure of this call; OK when there is none.
    Status checkAbortNotices(int awaited);
    // fail() for a wait on, or a write to, `peer` that failed with kTimeout
    // or kPeerFailure: blames from what is known about every member.
    Status failWait(int peer, const Status& status);
    void blame(int peer);
    void learnFromHeaders();
    // After round 0: the error of the lowest member that failed the call
    // locally; OK when none did.
    Status checkLocalFailures() const;

    CommState& state_;
    CallDesc call_;
    Deadline deadline_;
    uint32_t seq_ = 0;
    int call_round_ = 0;
    uint64_t first_round_ = 0;  // state_.round of this call's round 0
    bool everyone_in_place_ = false;
    // All indexed by rank; they live in state_.scratch.
    std::vector<uint8_t>& sent_;
    std::vector<const uint8_t*>& payload_;
    std::vector<size_t>& payload_bytes_;
    std::vector<const uint8_t*>& published_;
    std::vector<size_t>& published_bytes_;
    std::vector<MsgHeader>& headers_;  // round 0
    std::vector<const void*>& inputs_;
    uint64_t max_announced_ = 0;
    Status local_failure_;  // failTogether's argument
};

}  // namespace mooncake::pg::coll
