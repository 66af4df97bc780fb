// P2PMover: how a P2PEngine whose pools live outside the fabric's window
// (P2POptions::external_pools, e.g. in device memory) moves message data.
//
// Without a mover the engine stages a send into its window's send pool and
// puts it through the fabric, and the receiver memcpys it out of its
// window's receive pool: every byte is touched by the CPU. A mover instead
// queues copies that run on their own (a copy engine): the sender's
// straight from the user's buffer into the receive pool the peer keeps for
// it, the receiver's from that pool into the user's buffer. The engine
// acknowledges a chunk only once its put has completed, releases a pool
// chunk only once the copy out of it has completed, and completes a send
// only once its data has landed, so a user buffer is never read or written
// after its operation completed.
//
// Copies of one mover complete in the order they were queued (one queue,
// like a CUDA stream), so a ticket also stands for every earlier copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

// What the copies of one operation must wait for (for a GPU: the work queued
// on the caller's stream when the op was posted). Made by the mover's owner
// and handed to the engine with the op; the engine queues none of the op's
// copies before the mover says the order is ready, so on the mover's one
// queue no copy waits behind another op's predecessors.
class P2POrder {
public:
    virtual ~P2POrder() = default;
};

class P2PMover {
public:
    virtual ~P2PMover() = default;

    // Queues a copy of `bytes` from `src` (this rank's memory) to
    // `pool_offset` of the receive pool `peer` keeps for this rank, after
    // what `order` (the op's, may be null) names. Returns the copy's ticket.
    virtual Result<uint64_t> put(int peer, uint64_t pool_offset, const void* src, size_t bytes,
                                 const P2POrder* order) = 0;
    // Queues a copy of `bytes` from `pool_offset` of the receive pool this
    // rank keeps for `peer` to `dst`, after what `order` names.
    virtual Result<uint64_t> take(int peer, uint64_t pool_offset, void* dst, size_t bytes,
                                  const P2POrder* order) = 0;
    // Whether the copies of an op posted with `order` (null: none) may be
    // queued now. Polled by the progress thread until it is; once true it
    // must stay true.
    virtual bool ready(const P2POrder* order) = 0;
    // Whether copy `ticket` (and so every earlier one) has completed; an
    // error if the copies cannot complete (the engine then fails the pair).
    virtual Result<bool> completed(uint64_t ticket) = 0;
    // Waits until every copy queued so far has completed, or `deadline`.
    // Called before the engine fails operations whose copies are queued.
    virtual Status drain(Deadline deadline) = 0;
};

}  // namespace mooncake::pg
