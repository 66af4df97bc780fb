// Device reduce_scatter over the members' mapped windows (device_group.h):
// rank r's output is block r of the members' inputs, reduced in rank order
// with the CPU core's element semantics.
//
// Chunked (step_kernel.cuh): step j stages the j-th chunk (slot_bytes at
// most) of every block but this rank's own in its window, one slot per
// destination; each member then reduces its block from the members' slots
// and its own input, which is never staged. No host synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kReduceScatterCollective = 3;

// Queues the call on `stream`: output (count elements) = block `rank` (of
// count elements) of the members' inputs (size * count elements) reduced
// with op. seq and result as for allGather. Fails before queuing anything
// for arguments no kernel can run (unsupported dtype/op, bad group).
Status reduceScatter(const DeviceGroupView& group, const void* input, void* output, size_t count,
                     DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                     cudaStream_t stream);

}  // namespace mooncake::pg::device
