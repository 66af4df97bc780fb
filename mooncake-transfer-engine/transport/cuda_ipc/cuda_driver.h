// The CUDA driver API, loaded from libcuda.so.1 at run time so the transfer
// engine links and runs on machines without a GPU driver. Only the calls the
// cuda_ipc transport needs are resolved. Never throws.
#pragma once

#include <cuda.h>

#include <string>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

struct CudaDriver {
    // Resolved entry points. decltype keeps each signature tied to cuda.h,
    // including the _v2 names its macros select.
    decltype(&::cuInit) init;
    decltype(&::cuGetErrorString) getErrorString;
    decltype(&::cuDeviceGet) deviceGet;
    decltype(&::cuDeviceGetCount) deviceGetCount;
    decltype(&::cuDeviceGetAttribute) deviceGetAttribute;
    decltype(&::cuDevicePrimaryCtxRetain) primaryCtxRetain;
    decltype(&::cuDevicePrimaryCtxRelease) primaryCtxRelease;
    decltype(&::cuCtxGetCurrent) ctxGetCurrent;
    decltype(&::cuCtxSetCurrent) ctxSetCurrent;
    decltype(&::cuCtxGetDevice) ctxGetDevice;
    decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity;
    decltype(&::cuMemCreate) memCreate;
    decltype(&::cuMemRelease) memRelease;
    decltype(&::cuMemAddressReserve) memAddressReserve;
    decltype(&::cuMemAddressFree) memAddressFree;
    decltype(&::cuMemMap) memMap;
    decltype(&::cuMemUnmap) memUnmap;
    decltype(&::cuMemSetAccess) memSetAccess;
    decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle;
    decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle;
    decltype(&::cuStreamCreate) streamCreate;
    decltype(&::cuStreamDestroy) streamDestroy;
    decltype(&::cuStreamSynchronize) streamSynchronize;
    decltype(&::cuMemcpyAsync) memcpyAsync;
    decltype(&::cuPointerGetAttribute) pointerGetAttribute;

    // The driver, loaded and initialised once per process; kUnavailable with
    // the reason (no libcuda, no device, cuInit failed) otherwise.
    static Result<const CudaDriver*> get();

    // OK, or `what` failed: <driver's error name and text>.
    Status check(CUresult result, const std::string& what) const;
};

// Makes the primary context of `device` current on this thread (what the CUDA
// runtime and torch use), retaining it for the life of the process.
Status useDevice(const CudaDriver& cu, int device);

}  // namespace mooncake::te
