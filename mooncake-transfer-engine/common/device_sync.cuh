// Device-side primitives for kernels that signal each other across
// processes through mapped memory (same GPU or another GPU of the host):
// the global nanosecond timer deadlines are measured with, and system-scope
// acquire loads and release stores for flags. Shared by the PG device
// collectives and the EP kernels. CUDA sources only.
#pragma once

#include <cstdint>

namespace mooncake {

__device__ __forceinline__ uint64_t globalTimerNs() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint64_t loadAcquireSys(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void storeReleaseSys(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

}  // namespace mooncake
