// Communicator: the collectives of one group over a Fabric, torch-free.
//
// Every collective is a sequence of full-mesh "rounds" among the active
// ranks (see docs/design/pg-core.md): in a round each active rank writes one
// message (header + up to chunk_bytes of payload) into a slot of every other
// active rank's window and raises a per-sender flag; slots are double
// buffered and freed by acknowledgement flags. The first round of every
// collective carries a header describing the call (op, dtype, counts, root),
// so a call that differs between ranks fails on every rank with the same
// error instead of hanging or producing garbage.
//
// Calls on one Communicator must be issued in the same order on every active
// rank, from one thread at a time (the torch layer serialises them on a
// worker thread). Thread-compatible, not thread-safe.
//
// Errors: kInvalidArgument from an argument check (this rank's own, or the
// round-0 comparison of every rank's call) means every active rank failed the
// same call with the same error and the ranks are still in step: a rank whose
// own check fails still runs round 0 to tell the others. Any other error (kTimeout, kPeerFailure,
// ...) leaves the ranks out of step: later calls return kAborted until setMembership() starts a new
// epoch.
//
// The collective area of every window must be zero before its
// Communicator's first call (a freshly created window is).
//
// Reductions: AVG needs a floating-point dtype, BAND/BOR/BXOR an integer or
// bool one. For bool, SUM and MAX are logical or, PRODUCT and MIN logical
// and. Every element is reduced over the active ranks in rank order, so all
// ranks get bit-identical results; float16/bfloat16 are rounded after every
// step, integers wrap.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/types.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

struct CommOptions {
    // Bytes of payload per (sender, receiver) slot; two slots per pair.
    size_t chunk_bytes = 4 << 20;
    // Messages at most this large use one-shot algorithms.
    size_t one_shot_max_bytes = 64 << 10;
    // Byte offset of the collective area inside the fabric window.
    uint64_t window_offset = 0;
    // Threads per rank for the element-wise work of large reductions
    // (core/reduce_pool.h); 0: MC_PG_REDUCE_THREADS, else cores / ranks on
    // this host. Results are the same bits whatever the count.
    int reduce_threads = 0;
};

// Evidence from a failed call: which peers did not answer or failed.
struct CollectiveFailure {
    std::vector<int> failed_ranks;
};

class Communicator {
public:
    // Window bytes the collective area needs for `size` ranks.
    static size_t windowBytesFor(int size, const CommOptions& options);
    // How long setMembership's notices to members may wait for a member's
    // staging space (Fabric::put) before that member is left to find out at
    // its next call.
    static constexpr int64_t kMembershipNoticeTimeoutMs = 1000;

    Communicator(std::shared_ptr<Fabric> fabric, CommOptions options);
    ~Communicator();

    int rank() const;
    int size() const;

    // Which ranks take part from the next call on (default: all). Every
    // active rank must apply the same mask and epoch between the same two
    // calls. An epoch change resets the round counters, so flags written in
    // an older epoch are never mistaken for new ones. Epochs never decrease
    // (messages carry them modulo 2^16, so they may grow without bound; one
    // call should not skip more than 49151 epochs, see clearOlderFlags); the
    // mask may change within an epoch only before the epoch's first call.
    Status setMembership(const std::vector<uint8_t>& active, uint64_t epoch);
    const std::vector<uint8_t>& active() const;

    // in == out is allowed for every call whose in and out have the same size.
    // Other overlaps of in and out are not supported, except the in-place
    // forms noted below.
    Status allReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                     Deadline deadline);
    Status broadcast(void* buf, size_t bytes, int root, Deadline deadline);
    // Only the root's `out` is written (others may pass nullptr).
    Status reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root,
                  Deadline deadline);
    // out holds size() blocks of `bytes_per_rank`, in rank order (inactive
    // ranks' blocks are left untouched). `in` may be this rank's block of out.
    Status allGather(const void* in, void* out, size_t bytes_per_rank, Deadline deadline);
    // in holds size() blocks of `count_per_rank` elements; out gets this
    // rank's reduced block (out may be this rank's block of in).
    Status reduceScatter(const void* in, void* out, size_t count_per_rank, DataType dtype,
                         ReduceOp op, Deadline deadline);
    // send_bytes[p]/send_offsets[p]: what this rank sends to p, from `in`;
    // recv_bytes[p]/recv_offsets[p]: what it receives from p, into `out`.
    // A receiver's recv_bytes[p] must equal p's send_bytes[receiver]; in and
    // out must be different buffers.
    Status allToAllV(const void* in, const std::vector<size_t>& send_bytes,
                     const std::vector<size_t>& send_offsets, void* out,
                     const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets,
                     Deadline deadline);
    // out (root only) holds size() blocks of `bytes_per_rank`.
    Status gather(const void* in, void* out, size_t bytes_per_rank, int root, Deadline deadline);
    // in (root only) holds size() blocks of `bytes_per_rank`.
    Status scatter(const void* in, void* out, size_t bytes_per_rank, int root, Deadline deadline);
    Status barrier(Deadline deadline);

    // Tags the next call with an opaque description of the caller's buffers
    // (the torch layer hashes dtype and shape). Ranks whose next calls carry
    // different non-equal signatures fail it with kInvalidArgument on every
    // rank, like any other disagreement. Consumed by the next call, even
    // one that fails before its exchange.
    void setNextCallSignature(uint64_t signature);

    // Ranks the last failed call found unresponsive or failed.
    const CollectiveFailure& lastFailure() const;

private:
    class Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake::pg
