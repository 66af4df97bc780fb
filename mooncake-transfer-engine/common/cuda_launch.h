// The status of the kernel launches just queued on this thread, for the host
// side of CUDA sources (which link the CUDA runtime).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake {

// OK, or kInternal naming `what` and the runtime's error.
inline Status cudaLaunchStatus(const std::string& what) {
    const cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        return Status::OK();
    return Internal(what + " launch failed: " + cudaGetErrorString(err));
}

}  // namespace mooncake
