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
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kReduceScatterCollective = 3;
inline constexpr uint8_t kDirectReduceScatterCollective = 8;

// Queues the call on `stream`: output (count elements) = block `rank` (of
// count elements) of the members' inputs (size * count elements) reduced
// with op. seq and result as for allGather. Fails before queuing anything
// for arguments no kernel can run (unsupported dtype/op, bad group).
Status reduceScatter(const DeviceGroupView& group, const void* input, void* output, size_t count,
                     DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                     cudaStream_t stream);

// Direct: every member's input is mapped here (`buffers.inputs`); once
// every member has signalled its input ready, rank r reduces block r of them
// in rank order straight into its output (`buffers.outputs[rank]`; the
// others' are not read), then waits until every member has
// read before the call completes (three steps, no window copies).
Status directReduceScatter(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                           DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                           cudaStream_t stream);

}  // namespace mooncake::pg::device
