// P2PEngine: send/recv between two ranks of a group over a Fabric, with the
// receiver-driven credit protocol:
//   * recv(src, tag) reserves chunks of the receiver's pool for `src` and
//     writes a CreditSlot into src's window (credit ring, one per pair);
//   * the sender stages data in its own send pool, and on a matching credit
//     puts the chunk into the receiver's pool and writes an AckSlot into the
//     receiver's window (ack ring);
//   * the receiver copies the chunk to the user buffer and frees the chunk.
// Slots carry a header token and a footer token made of (pair epoch,
// sequence); a slot is consumed only when both tokens equal the expected
// value, so torn (half-written) and stale (older epoch) slots are never used.
// Each pair of ranks has its own epoch (setMembership), so a membership
// change restarts only the pairs it concerns.
//
// send() returns once the data is staged (the user buffer may be reused);
// it does not wait for the receive to be posted, as long as the send pool
// has room. Matching is in posting order per (peer, tag).
//
// Every rank of the group must use the same P2POptions. The wire format and
// the window layout are in core/p2p/slots.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/p2p_mover.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

struct P2POptions {
    // Receive pool bytes per source peer and send pool bytes per destination.
    size_t pool_bytes_per_peer = 4 << 20;
    size_t chunk_bytes = 1 << 20;
    int ring_slots = 16;
    uint64_t window_offset = 0;
    // The pools live outside the window (a P2PMover moves the data; the
    // window holds only the rings): no send pool, and a send completes once
    // its data has landed in the receiver's pool instead of once staged.
    bool external_pools = false;
};

// Counters for monitoring and tests.
struct P2PStats {
    uint64_t progress_passes = 0;  // passes of the progress thread
    // The progress thread waits, with no timeout, for an op to be posted:
    // it makes no pass until then (an idle engine costs no CPU).
    bool parked = false;
    uint64_t credits_received = 0;  // credit slots consumed (this rank sending)
    uint64_t acks_received = 0;     // ack slots consumed (this rank receiving)
};

class P2PEngine {
public:
    // Completion callback: called once, from the progress thread or the
    // caller's thread, with the final status of the operation.
    using Callback = std::function<void(Status)>;
    // An any-source recv's callback: the status and the sender's rank (-1
    // when no sender was matched).
    using AnyCallback = std::function<void(Status, int source)>;

    static size_t windowBytesFor(int size, const P2POptions& options);

    P2PEngine(std::shared_ptr<Fabric> fabric, P2POptions options);
    // With options.external_pools: `mover` moves the data (p2p_mover.h).
    P2PEngine(std::shared_ptr<Fabric> fabric, P2POptions options, std::shared_ptr<P2PMover> mover);
    // Fails pending operations with kAborted and joins the progress thread.
    // Destroyed on that thread (from a completion callback), it hands the
    // teardown to a thread of its own instead, which runs once the callback
    // has returned.
    ~P2PEngine();

    // Whether the caller runs on the progress thread (in a callback).
    bool onProgressThread() const;

    // Enqueue and return. `done` fires when the operation completes or the
    // deadline passes (kTimeout) or the peer fails (kPeerFailure). A non-OK
    // return means nothing was enqueued and `done` will never be called.
    // A send completes when its data is staged (external pools: once it has
    // landed at the receiver); a size mismatch found after that fails only
    // the recv (the sender logs it). A recv's size must equal
    // the matching send's size (kInvalidArgument on both sides otherwise).
    // `order`: with external pools, passed to the mover with each of the
    // op's copies (p2p_mover.h); ignored otherwise.
    Status send(const void* buf, size_t bytes, int peer, int tag, Deadline deadline, Callback done,
                std::shared_ptr<const P2POrder> order = nullptr);
    Status recv(void* buf, size_t bytes, int peer, int tag, Deadline deadline, Callback done,
                std::shared_ptr<const P2POrder> order = nullptr);
    // A recv that takes the first message on `tag` any active peer offers
    // (the peers active when it is posted). Per sender and tag, messages
    // still match recvs in posting order, any-source ones included: a later
    // recv from a peer on `tag` waits until this one is matched. It fails
    // (kPeerFailure) only when every candidate peer has failed. Each pending
    // any-source recv holds two ring slots per candidate peer.
    Status recvAny(void* buf, size_t bytes, int tag, Deadline deadline, AnyCallback done,
                   std::shared_ptr<const P2POrder> order = nullptr);

    // Applies a membership. active[r]: rank r is an active member;
    // pair_epoch[r]: the epoch of the pair (this rank, r), which both ranks
    // of the pair must compute alike from the same view (the elastic backend
    // uses the later of the two ranks' activation epochs). Per peer:
    //   * both ranks stay active and the pair epoch is unchanged: nothing
    //     happens; pending operations go on and staged data is delivered;
    //   * the pair epoch changed (or the pair becomes usable again): pending
    //     operations with the peer fail with kAborted and the pair's ring
    //     sequences restart in the new pair epoch;
    //   * the peer is no longer active: they fail with kPeerFailure;
    //   * this rank is no longer active: every pair stops (kAborted), and
    //     posts fail with kUnavailable until it is active again.
    // A pair that becomes usable again in its previous pair epoch stays
    // unusable until the epoch changes (restarting the sequences in the same
    // token epoch is unsafe). The entries for this rank itself only count
    // through active[rank]. A pair epoch that changes to a value equal
    // modulo 2^16 (the token's epoch bits) makes the call fail with
    // kInvalidArgument, and nothing changes. The callbacks of the operations
    // it fails run on the engine's progress thread, soon after it returns,
    // never inside it (so one may drop the caller's last reference).
    Status setMembership(const std::vector<uint8_t>& active,
                         const std::vector<uint64_t>& pair_epoch);

    // The former one-epoch form: every pair gets pair epoch `epoch`. The
    // first form keeps the current active set (initially everyone), so the
    // same epoch only cuts off newly inactive peers, and a new one restarts
    // every pair.
    Status setEpoch(uint64_t epoch);
    Status setEpoch(uint64_t epoch, const std::vector<uint8_t>& active);

    P2PStats stats() const;

    // Waits until every send posted so far has been delivered to its
    // receiver (not just staged), has failed, or its peer is gone; kTimeout
    // naming how many are left at the deadline. For a clean shutdown: a
    // completed send is only staged, and tearing down would drop it.
    Status flushSends(Deadline deadline);

private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake::pg
