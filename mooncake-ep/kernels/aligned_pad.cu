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

}  // namespace

Status launchAlignedPad(uint64_t min_ns, uint64_t period_ns, cudaStream_t stream) {
    if (min_ns == 0 || period_ns == 0)
        return InvalidArgument("an aligned pad needs min_ns > 0 and period_ns > 0, got " +
                               std::to_string(min_ns) + " and " + std::to_string(period_ns));
    alignedPad<<<1, 1, 0, stream>>>(min_ns, period_ns);
    return cudaLaunchStatus("aligned pad");
}

}  // namespace mooncake::ep
