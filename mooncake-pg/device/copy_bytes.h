// A device-to-device copy by a kernel (the SMs) instead of cudaMemcpyAsync,
// for copies between buffers of processes on one GPU (IPC-mapped pools),
// where the runtime's copy may run on a copy engine at a fraction of the
// rate the SMs reach (P2P on device pools, MC_PG_CUDA_P2P_COPY=kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

// Queues the copy of `bytes` from `src` to `dst` (both device memory this
// process can address, not overlapping) on `stream`. 16-byte words where
// both addresses are 16-byte aligned, bytes otherwise. kInternal when the
// launch fails; nothing is queued for 0 bytes.
Status launchCopyBytes(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace mooncake::pg::device
