// Device broadcast over the members' mapped windows (device_group.h): the
// root's buffer is copied into every member's buffer.
//
// Chunked (step_kernel.cuh): step j stages the j-th chunk of the root's
// buffer (size * slot_bytes bytes at most) in the root's window; the others
// pull it in the next kernel. Every member signals every step, so the root
// rewrites a parity only after everyone has read it. No host
// synchronization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kBroadcastCollective = 5;
// Its own id, the root in the signature's op field, as broadcast.
inline constexpr uint8_t kScatterCollective = 12;

// Queues the call on `stream`: `buffer` (count elements) is read at `root`
// and written everywhere else. The root is part of the call signature. seq
// and result as for allGather. Fails before queuing anything for arguments no
// kernel can run (root out of range, bad group).
Status broadcast(const DeviceGroupView& group, void* buffer, size_t count, DataType dtype, int root,
                 uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

// Scatter from `root`: block r (count elements) of the root's `input`
// (size * count elements; the others' is not read and may be null) is
// written to rank r's `output`. The broadcast's steps over the root's whole
// input, each member keeping only the part of each chunk in its block.
Status scatter(const DeviceGroupView& group, const void* input, void* output, size_t count,
               DataType dtype, int root, uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

}  // namespace mooncake::pg::device
