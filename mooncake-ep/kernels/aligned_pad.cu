#include "mooncake-ep/kernels/aligned_pad.h"

#include <string>

#include "mooncake-transfer-engine/common/cuda_launch.h"
#include "mooncake-transfer-engine/common/device_sync.cuh"

namespace mooncake::ep {
namespace {

__global__ void alignedPad(uint64_t min_ns, uint64_t period_ns) {
    const uint64_t start = globalTimerNs();
    const uint64_t end = ((start + min_ns) / period_ns + 1) * period_ns;
    while (globalTimerNs() < end)
        __nanosleep(1000);
}

__global__ void padUntil(uint64_t target_ns, uint64_t max_wait_ns) {
    const uint64_t start = globalTimerNs();
    for (uint64_t now = start; now < target_ns && now - start < max_wait_ns; now = globalTimerNs())
        __nanosleep(1000);
}

__global__ void readGpuClock(uint64_t* out) {
    *out = globalTimerNs();
}

}  // namespace

Status launchPadUntil(uint64_t target_ns, uint64_t max_wait_ns, cudaStream_t stream) {
    if (max_wait_ns == 0)
        return InvalidArgument("a pad until an instant needs max_wait_ns > 0, got 0");
    padUntil<<<1, 1, 0, stream>>>(target_ns, max_wait_ns);
    return cudaLaunchStatus("pad until");
}

Status launchReadGpuClock(uint64_t* out, cudaStream_t stream) {
    if (out == nullptr)
        return InvalidArgument("reading the GPU clock needs a device word to write, got null");
    readGpuClock<<<1, 1, 0, stream>>>(out);
    return cudaLaunchStatus("read GPU clock");
}

Status launchAlignedPad(uint64_t min_ns, uint64_t period_ns, cudaStream_t stream) {
    if (min_ns == 0 || period_ns == 0)
        return InvalidArgument("an aligned pad needs min_ns > 0 and period_ns > 0, got " +
                               std::to_string(min_ns) + " and " + std::to_string(period_ns));
    alignedPad<<<1, 1, 0, stream>>>(min_ns, period_ns);
    return cudaLaunchStatus("aligned pad");
}

}  // namespace mooncake::ep
