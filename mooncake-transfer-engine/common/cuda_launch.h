// Launch-side helpers for the host side of CUDA sources (which link the CUDA
// runtime): the status of a runtime call and of the kernel launches just
// queued on this thread, and the SM count grids are sized by.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake {

// OK for cudaSuccess, else kInternal("<what>: <the runtime's error>").
inline Status cudaStatus(cudaError_t e, const std::string& what) {
    if (e == cudaSuccess)
        return Status::OK();
    return Internal(what + ": " + cudaGetErrorString(e));
}

// OK, or kInternal naming `what` and the runtime's error.
inline Status cudaLaunchStatus(const std::string& what) {
    const cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        return Status::OK();
    return Internal(what + " launch failed: " + cudaGetErrorString(err));
}

// The current device's SM count; 16, a conservative share, when the device
// cannot be asked (the error is cleared so later launches do not report it).
inline int currentDeviceSmCount() {
    int device = 0;
    int sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 16;
    }
    return sms;
}

}  // namespace mooncake
