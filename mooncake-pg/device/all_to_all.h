// Device all_to_all with equal splits over the members' mapped windows
// (device_group.h): block d of rank s's input becomes block s of rank d's
// output.
//
// Chunked (step_kernel.cuh): step j stages the j-th chunk (slot_bytes at
// most) of every block bound for another member in this rank's window, one
// slot per destination, and copies its own block's chunk straight to its
// output; the members pull their slots in the next kernel. No host
// synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kAllToAllCollective = 4;
inline constexpr uint8_t kDirectAllToAllCollective = 9;

// Queues the call on `stream`: input and output hold size blocks of `count`
// elements each. seq and result as for allGather. Fails before queuing
// anything for arguments no kernel can run.
Status allToAll(const DeviceGroupView& group, const void* input, void* output, size_t count,
                DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

// Direct: every member's input is mapped here (`buffers.inputs`; outputs
// are this rank's only, and must not overlap its input: the members read
// it while this rank writes): once every member has signalled its input
// ready, each rank copies block `rank` of every member's input into its
// output, then waits until every member has copied before the call
// completes (three steps, no window copies). `count` elements per block.
Status directAllToAll(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                      DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

}  // namespace mooncake::pg::device
