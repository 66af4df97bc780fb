// P2PEngine: send/recv between two ranks of a group over a Fabric, with the
// receiver-driven credit protocol:
//   * recv(src, tag) reserves chunks of the receiver's pool for `src` and
//     writes a CreditSlot into src's window (credit ring, one per pair);
//   * the sender stages data in its own send pool, and on a matching credit
//     puts the chunk into the receiver's pool and writes an AckSlot into the
//     receiver's window (ack ring);
//   * the receiver copies the chunk to the user buffer and frees the chunk.
// Slots carry a header token and a footer token made of (group epoch,
// sequence); a slot is consumed only when both tokens equal the expected
// value, so torn (half-written) and stale (older epoch) slots are never used.
//
// send() returns once the data is staged (the user buffer may be reused);
// it does not wait for the receive to be posted, as long as the send pool
// has room. Matching is in posting order per (peer, tag).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

struct P2POptions {
    // Receive pool bytes per source peer and send pool bytes per destination.
    size_t pool_bytes_per_peer = 4 << 20;
    size_t chunk_bytes = 1 << 20;
    int ring_slots = 16;
    uint64_t window_offset = 0;
};

class P2PEngine {
public:
    // Completion callback: called once, from the progress thread or the
    // caller's thread, with the final status of the operation.
    using Callback = std::function<void(Status)>;

    static size_t windowBytesFor(int size, const P2POptions& options);

    P2PEngine(std::shared_ptr<Fabric> fabric, P2POptions options);
    ~P2PEngine();  // fails pending operations with kAborted, joins the thread

    // Enqueue and return. `done` fires when the operation completes or the
    // deadline passes (kTimeout) or the peer fails (kPeerFailure).
    Status send(const void* buf, size_t bytes, int peer, int tag, Deadline deadline,
                Callback done);
    Status recv(void* buf, size_t bytes, int peer, int tag, Deadline deadline, Callback done);

    // Same rule as Communicator::setMembership; pending operations with a
    // peer that is no longer active fail with kPeerFailure.
    Status setEpoch(uint32_t epoch);

private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake::pg
