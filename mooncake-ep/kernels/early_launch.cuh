// Programmatic dependent launch for a split receive (epSplitReceive): the
// copy kernel queued after the one-block wait kernel is scheduled as soon
// as every thread of the wait kernel is past its waits, instead of after
// that grid has ended and the launch has gone through the stream, so its
// blocks are resident when the wait ends. They still copy only after the
// wait grid has ended and its writes (active_ranks) are visible. Compute
// capability 9.0 and later; elsewhere a plain launch in stream order.
#pragma once

#include <cuda_runtime_api.h>

namespace mooncake::ep {

// The wait kernel, once every thread of its block has done its waiting (the
// first call of any thread triggers the block: meet at __syncthreads first).
__device__ __forceinline__ void epLetDependentGridStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The copy kernel, before it reads anything the wait kernel decided.
__device__ __forceinline__ void epAwaitPrecedingGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether the current device takes the launch attribute (cached per process:
// the ranks of a process share one device kind).
inline bool epEarlyLaunchSupported() {
    static const bool supported = [] {
        int device = 0, major = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) !=
                cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        return major >= 9;
    }();
    return supported;
}

// Queues kernel<<<grid, threads, shared_bytes, stream>>>(params), early where
// supported. The launch's error is left for cudaLaunchStatus.
template <typename Params>
void epLaunchAfterWaitKernel(void (*kernel)(Params), int grid, int threads, size_t shared_bytes,
                             cudaStream_t stream, const Params& params) {
    if (!epEarlyLaunchSupported()) {
        kernel<<<grid, threads, shared_bytes, stream>>>(params);
        return;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(grid);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    cudaLaunchAttribute early = {};
    early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &early;
    config.numAttrs = 1;
    (void)cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace mooncake::ep
