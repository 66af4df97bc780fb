// Device all_gather over the members' mapped windows (device_group.h): every
// rank's `count` elements land, in rank order, in every rank's output.
//
// Chunked (step_kernel.cuh): step j stages the j-th chunk of this rank's
// input (size * slot_bytes bytes at most) in its own window; the members
// pull it into their outputs in the next kernel. No host synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kAllGatherCollective = 2;
inline constexpr uint8_t kDirectAllGatherCollective = 7;
// A gather to root r runs the all_gather's window steps with only the root
// copying the blocks out. Its own id, the root in the signature's op field:
// ranks that disagree on the root, or call all_gather, fail with kMismatch.
inline constexpr uint8_t kGatherCollective = 11;

// Queues the call on `stream`: output (size * count elements) = every
// member's input (count elements) in rank order. `seq` numbers the group's
// device calls (every rank passes the same seq for the same call); `result`
// must be zeroed by the caller and stay valid until the stream work
// completes. Fails before queuing anything for arguments no kernel can run.
Status allGather(const DeviceGroupView& group, const void* input, void* output, size_t count,
                 DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

// As allGather, but only `root` writes its `output` (size * count
// elements); the others' `output` is not touched and may be null.
Status gather(const DeviceGroupView& group, const void* input, void* output, size_t count,
              DataType dtype, int root, uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

// Direct: every member's input is mapped here (`buffers.inputs`; outputs
// are this rank's only): once every member has signalled its input ready,
// each rank copies the members' inputs into its output, then waits until
// every member has copied before the call completes (three steps, no window
// copies). `count` elements per member; the window carries only flags.
Status directAllGather(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                       DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

}  // namespace mooncake::pg::device
