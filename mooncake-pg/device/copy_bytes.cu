#include "mooncake-pg/device/copy_bytes.h"

#include <algorithm>
#include <cstdint>

#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::pg::device {
namespace {

// Enough blocks to keep the HBM busy while other ranks' kernels share the
// GPU, few enough that a copy never holds most of its SMs.
constexpr int kCopyThreads = 512;
constexpr int kMaxCopyBlocks = 32;
constexpr size_t kWordBytes = sizeof(int4);

__global__ void __launch_bounds__(kCopyThreads)
    copyWords(int4* dst, const int4* src, size_t words, uint8_t* dst_tail, const uint8_t* src_tail,
              size_t tail_bytes) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (size_t i = first; i < words; i += stride)
        dst[i] = __ldcs(src + i);
    for (size_t i = first; i < tail_bytes; i += stride)
        dst_tail[i] = src_tail[i];
}

}  // namespace

Status launchCopyBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes == 0)
        return Status::OK();
    const bool aligned =
        ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % kWordBytes) == 0;
    const size_t words = aligned ? bytes / kWordBytes : 0;
    const size_t head = words * kWordBytes;
    const size_t units = std::max(words, bytes - head);
    const size_t blocks =
        std::min<size_t>(kMaxCopyBlocks, (units + kCopyThreads - 1) / kCopyThreads);
    copyWords<<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
        static_cast<int4*>(dst), static_cast<const int4*>(src), words,
        static_cast<uint8_t*>(dst) + head, static_cast<const uint8_t*>(src) + head, bytes - head);
    return cudaLaunchStatus("P2P copy kernel");
}

}  // namespace mooncake::pg::device
