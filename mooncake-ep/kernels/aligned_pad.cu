#include "mooncake-ep/kernels/aligned_pad.h"

#include <string>

#include "mooncake-transfer-engine/common/cuda_launch.h"
#include "mooncake-transfer-engine/common/device_sync.cuh"

namespace mooncake::ep {
namespace {

// A busy pad polls the clock without sleeping, in every thread of its
// blocks, so the SMs it holds stay active, as between the layers of a model
// (a sleeping thread leaves the GPU nearly idle, which may lower its clock;
// on an H100 shared by 8 ranks the clock stayed at its maximum either way).
__device__ void padStep(bool busy) {
    if (!busy)
        __nanosleep(1000);
}

__global__ void alignedPad(uint64_t min_ns, uint64_t period_ns, bool busy) {
    const uint64_t start = globalTimerNs();
    const uint64_t end = ((start + min_ns) / period_ns + 1) * period_ns;
    while (globalTimerNs() < end)
        padStep(busy);
}

__global__ void padUntil(uint64_t target_ns, uint64_t max_wait_ns, bool busy) {
    const uint64_t start = globalTimerNs();
    for (uint64_t now = start; now < target_ns && now - start < max_wait_ns; now = globalTimerNs())
        padStep(busy);
}

// One warp per busy block; a sleeping pad is one thread.
constexpr int kBusyPadThreads = 32;

dim3 padGrid(int busy_blocks) {
    return dim3(busy_blocks > 0 ? static_cast<unsigned>(busy_blocks) : 1u);
}

dim3 padBlock(int busy_blocks) {
    return dim3(busy_blocks > 0 ? kBusyPadThreads : 1);
}

__global__ void readGpuClock(uint64_t* out) {
    *out = globalTimerNs();
}

}  // namespace

Status checkPadBusyBlocks(int64_t busy_blocks) {
    if (busy_blocks < 0 || busy_blocks > kMaxPadBusyBlocks)
        return InvalidArgument("busy_blocks must be 0 (one sleeping thread) to " +
                               std::to_string(kMaxPadBusyBlocks) + ", got " +
                               std::to_string(busy_blocks));
    return Status::OK();
}

Status launchPadUntil(uint64_t target_ns, uint64_t max_wait_ns, cudaStream_t stream,
                      int busy_blocks) {
    if (max_wait_ns == 0)
        return InvalidArgument("a pad until an instant needs max_wait_ns > 0, got 0");
    MC_RETURN_IF_ERROR(checkPadBusyBlocks(busy_blocks));
    padUntil<<<padGrid(busy_blocks), padBlock(busy_blocks), 0, stream>>>(target_ns, max_wait_ns,
                                                                         busy_blocks > 0);
    return cudaLaunchStatus("pad until");
}

Status launchReadGpuClock(uint64_t* out, cudaStream_t stream) {
    if (out == nullptr)
        return InvalidArgument("reading the GPU clock needs a device word to write, got null");
    readGpuClock<<<1, 1, 0, stream>>>(out);
    return cudaLaunchStatus("read GPU clock");
}

Status launchAlignedPad(uint64_t min_ns, uint64_t period_ns, cudaStream_t stream, int busy_blocks) {
    if (min_ns == 0 || period_ns == 0)
        return InvalidArgument("an aligned pad needs min_ns > 0 and period_ns > 0, got " +
                               std::to_string(min_ns) + " and " + std::to_string(period_ns));
    MC_RETURN_IF_ERROR(checkPadBusyBlocks(busy_blocks));
    alignedPad<<<padGrid(busy_blocks), padBlock(busy_blocks), 0, stream>>>(min_ns, period_ns,
                                                                           busy_blocks > 0);
    return cudaLaunchStatus("aligned pad");
}

}  // namespace mooncake::ep
