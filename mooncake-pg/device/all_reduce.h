// Device all_reduce over the members' mapped windows (device_group.h).
//
// One-shot: every rank pushes its whole input into its slot at every member,
// raises its flag there, waits for every member's flag in its own window and
// reduces the members' slots in rank order. Two kernels on the caller's
// stream (the boundary between them orders every block's pushes before any
// wait), no host synchronization, so a call can be captured in a CUDA graph.
// The input must fit one slot: count * dtype size <= slot_bytes.
//
// Two-shot (step_kernel.cuh): the message runs in chunks of size * slot_bytes
// bytes, each in two steps. Reduce-scatter: every rank stages the chunk (all
// but its own piece) in its window; rank r reduces piece r of the chunk from
// the members' windows and its own input, in rank order, into its output
// and into its window. All-gather: every rank pulls the other members'
// reduced pieces into its output. Per rank it moves about 4x the message
// (2x is the floor) against the one-shot's 2 * (size + 1)x, for two more
// flag round trips per call.
//
// allReduce picks: one-shot up to kOneShotMaxBytes (and one slot), two-shot
// above.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kAllReduceCollective = 1;
// Messages from this size take the direct path when every member's buffers
// can be shared (the backend's choice; cuda_direct.cc). Below it the host
// exchange that shares them (two host all_gathers) would cost more than the
// window copies it saves. Not yet measured: set from the two-shot's cost.
inline constexpr uint64_t kDirectMinBytes = uint64_t{4} << 20;
// Its own id, so ranks that took different paths fail with kMismatch.
inline constexpr uint8_t kDirectAllReduceCollective = 6;

// A reduce to root r runs as an all_reduce whose non-root outputs the caller
// discards (the traffic is the same order, the kernels are shared). Its calls
// are signed with one collective id per root, window and direct paths apart,
// so ranks that disagree on the root, or call all_reduce where another calls
// reduce, fail with kMismatch instead of each taking a result.
inline constexpr uint8_t kReduceCollectiveBase = 64;
inline constexpr uint8_t kDirectReduceCollectiveBase = kReduceCollectiveBase + kMaxDeviceRanks;
static_assert(kDirectReduceCollectiveBase + kMaxDeviceRanks <= 256);

// The id a reduction call signs with: all_reduce when `reduce_root` < 0.
MC_HOST_DEVICE inline constexpr uint8_t reductionCollective(bool direct, int reduce_root) {
    if (reduce_root < 0)
        return direct ? kDirectAllReduceCollective : kAllReduceCollective;
    return static_cast<uint8_t>((direct ? kDirectReduceCollectiveBase : kReduceCollectiveBase) +
                                reduce_root);
}

// InvalidArgument unless `reduce_root` is -1 (all_reduce) or a rank of the group.
Status checkReduceRoot(const DeviceGroupView& group, int reduce_root, const char* what);

// Messages up to this size (that also fit a slot) take the one-shot path.
// Measured on one H200 with MPS (docs/design/pg-core.md): the two-shot's
// fixed cost (four kernels, three flag round trips) is 41 us with 2
// processes and 80-90 us with 4, flat up to 1 MiB; the one-shot costs the
// same at 1 MiB (43 / 80 us) and less below, and grows fast above (its push
// runs one block per destination: 220 / 317 us at 4 MiB).
inline constexpr uint64_t kOneShotMaxBytes = 1 << 20;

// Queues the call on `stream`. `seq` numbers the group's device calls (every
// rank passes the same seq for the same call); `result` must be zeroed by the
// caller and stay valid until the stream work completes. Fails before
// queuing anything for arguments no kernel can run (unsupported dtype/op,
// input larger than a slot, bad group).
Status oneShotAllReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                        DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                        cudaStream_t stream, int reduce_root = -1);

// As oneShotAllReduce, for any size; input may equal output.
Status twoShotAllReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                        DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                        cudaStream_t stream, int reduce_root = -1);

// Direct: no byte goes through the windows, which then carry only the flags.
// Every member's input and output are mapped in every member's process
// (`buffers`), and the call runs three steps: each rank signals that its
// input is ready; rank r reduces piece r of the members' inputs, in rank
// order, and writes it into piece r of every member's output; the barriers
// after it keep each rank's buffers until no member reads or writes them.
// All ranks together read each input once and write each output once (the
// traffic limit), against about twice that for two-shot. An input may equal
// its output, but not overlap it otherwise (InvalidArgument).
Status directAllReduce(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                       DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                       cudaStream_t stream, int reduce_root = -1);

// Every entry point takes `reduce_root`: -1 for an all_reduce, a rank for a
// reduce to it (reductionCollective; the kernels are the same).
//
// One-shot or two-shot by size (kOneShotMaxBytes). Every rank picks the same
// for the same call; a call whose counts differ fails with kMismatch
// whichever each rank picked.
Status allReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                 DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                 cudaStream_t stream, int reduce_root = -1);

}  // namespace mooncake::pg::device
