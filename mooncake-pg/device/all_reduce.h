// Device all_reduce over the members' mapped windows (device_group.h).
//
// One-shot: every rank pushes its whole input into its slot at every member,
// raises its flag there, waits for every member's flag in its own window and
// reduces the members' slots in rank order. Two kernels on the caller's
// stream (the boundary between them orders every block's pushes before any
// wait), no host synchronization, so a call can be captured in a CUDA graph.
// The input must fit one slot: count * dtype size <= slot_bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kAllReduceCollective = 1;

// Queues the call on `stream`. `seq` numbers the group's device calls (every
// rank passes the same seq for the same call); `result` must be zeroed by the
// caller and stay valid until the stream work completes. Fails before
// queuing anything for arguments no kernel can run (unsupported dtype/op,
// input larger than a slot, bad group).
Status oneShotAllReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                        DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                        cudaStream_t stream);

}  // namespace mooncake::pg::device
