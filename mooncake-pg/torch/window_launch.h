// launchOnWindow: one kernel call's kernels through the group window, the
// path every collective takes but the direct one (device/direct_*.cu):
// shared by the worker's runKernelCall (cuda_collectives.cc) and the
// caller's own launch (cuda_caller_launch.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/torch/kernel_call.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

// Bounds a kernel call's deadline arithmetic (Deadline::never() has no end).
inline constexpr std::chrono::nanoseconds kMaxKernelWait = std::chrono::hours(24 * 365);

// Queues `call`'s kernels on `stream` against `view`; `src` and `dst` are
// the call's contiguous input and output (a broadcast's one buffer is
// `dst`), `result` its slot. The call counter numbers the call, so every
// call `view`'s window queues must go through it or device::skipCall.
Status launchOnWindow(const KernelCall& call, const device::DeviceGroupView& view, const void* src,
                      void* dst, device::DeviceOpResult* result, cudaStream_t stream);

}  // namespace mooncake::pg
