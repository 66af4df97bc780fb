// Marks functions that both the host and CUDA kernels call (layout math,
// signal encoding), so the same definition serves the launch checks, the
// kernels and the tests.
#pragma once

#ifdef __CUDACC__
#define MC_EP_HD __host__ __device__
#else
#define MC_EP_HD
#endif
