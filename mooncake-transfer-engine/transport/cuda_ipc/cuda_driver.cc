#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace mooncake::te {

namespace {

#define MC_CU_STRINGIFY2(x) #x
// Expands cuda.h's versioning macros first: "cuStreamDestroy_v2", not "cuStreamDestroy".
#define MC_CU_STRINGIFY(x) MC_CU_STRINGIFY2(x)

struct Loaded {
    CudaDriver driver{};
    Status status;
};

Loaded load() {
    Loaded out;
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* why = ::dlerror();
        out.status = Unavailable(std::string("no CUDA driver: ") + (why ? why : "dlopen failed"));
        return out;
    }
    // The library stays loaded for the life of the process: other libraries
    // (torch) share it, and unloading it is never safe while contexts exist.
    std::string missing;
    auto resolve = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
        if (!fn)
            missing += std::string(missing.empty() ? "" : ", ") + name;
    };
#define MC_CU_RESOLVE(field, sym) resolve(out.driver.field, MC_CU_STRINGIFY(sym))
    MC_CU_RESOLVE(init, cuInit);
    MC_CU_RESOLVE(getErrorString, cuGetErrorString);
    MC_CU_RESOLVE(deviceGet, cuDeviceGet);
    MC_CU_RESOLVE(deviceGetCount, cuDeviceGetCount);
    MC_CU_RESOLVE(deviceGetAttribute, cuDeviceGetAttribute);
    MC_CU_RESOLVE(primaryCtxRetain, cuDevicePrimaryCtxRetain);
    MC_CU_RESOLVE(primaryCtxRelease, cuDevicePrimaryCtxRelease);
    MC_CU_RESOLVE(ctxGetCurrent, cuCtxGetCurrent);
    MC_CU_RESOLVE(ctxSetCurrent, cuCtxSetCurrent);
    MC_CU_RESOLVE(ctxGetDevice, cuCtxGetDevice);
    MC_CU_RESOLVE(memGetAllocationGranularity, cuMemGetAllocationGranularity);
    MC_CU_RESOLVE(memCreate, cuMemCreate);
    MC_CU_RESOLVE(memRelease, cuMemRelease);
    MC_CU_RESOLVE(memAddressReserve, cuMemAddressReserve);
    MC_CU_RESOLVE(memAddressFree, cuMemAddressFree);
    MC_CU_RESOLVE(memMap, cuMemMap);
    MC_CU_RESOLVE(memUnmap, cuMemUnmap);
    MC_CU_RESOLVE(memSetAccess, cuMemSetAccess);
    MC_CU_RESOLVE(memExportToShareableHandle, cuMemExportToShareableHandle);
    MC_CU_RESOLVE(memImportFromShareableHandle, cuMemImportFromShareableHandle);
    MC_CU_RESOLVE(streamCreate, cuStreamCreate);
    MC_CU_RESOLVE(streamDestroy, cuStreamDestroy);
    MC_CU_RESOLVE(streamSynchronize, cuStreamSynchronize);
    MC_CU_RESOLVE(memcpyAsync, cuMemcpyAsync);
    MC_CU_RESOLVE(pointerGetAttribute, cuPointerGetAttribute);
#undef MC_CU_RESOLVE
    if (!missing.empty()) {
        out.status = Unavailable("the CUDA driver lacks " + missing);
        return out;
    }
    out.status = out.driver.check(out.driver.init(0), "cuInit");
    if (out.status.ok()) {
        int count = 0;
        out.status = out.driver.check(out.driver.deviceGetCount(&count), "cuDeviceGetCount");
        if (out.status.ok() && count == 0)
            out.status = Unavailable("no CUDA device");
    }
    return out;
}

}  // namespace

Result<const CudaDriver*> CudaDriver::get() {
    static const Loaded loaded = load();
    if (!loaded.status.ok())
        return loaded.status;
    return &loaded.driver;
}

Status CudaDriver::check(CUresult result, const std::string& what) const {
    if (result == CUDA_SUCCESS)
        return Status::OK();
    const char* text = nullptr;
    if (getErrorString)
        (void)getErrorString(result, &text);
    std::string message = what + " failed: " + (text ? text : "CUDA error") + " (" +
                          std::to_string(static_cast<int>(result)) + ")";
    // An unsupported feature or a device that is gone is not the caller's bug.
    if (result == CUDA_ERROR_NOT_SUPPORTED || result == CUDA_ERROR_NO_DEVICE ||
        result == CUDA_ERROR_INVALID_DEVICE || result == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
        return Unavailable(message);
    if (result == CUDA_ERROR_INVALID_VALUE)
        return InvalidArgument(message);
    return Internal(message);
}

Status useDevice(const CudaDriver& cu, int device) {
    CUdevice dev = 0;
    MC_RETURN_IF_ERROR(
        cu.check(cu.deviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")"));
    CUcontext current = nullptr;
    MC_RETURN_IF_ERROR(cu.check(cu.ctxGetCurrent(&current), "cuCtxGetCurrent"));
    if (current) {
        CUdevice current_dev = 0;
        if (cu.ctxGetDevice(&current_dev) == CUDA_SUCCESS && current_dev == dev)
            return Status::OK();
    }
    // Retained once per device and never released: the primary context is the
    // one torch uses too, and releasing it under torch would destroy it.
    static std::mutex mu;
    static std::vector<CUcontext> retained(64, nullptr);
    CUcontext ctx = nullptr;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (device < 0 || static_cast<size_t>(device) >= retained.size())
            return InvalidArgument("CUDA device ordinal " + std::to_string(device) +
                                   " out of range");
        if (!retained[device]) {
            MC_RETURN_IF_ERROR(
                cu.check(cu.primaryCtxRetain(&retained[device], dev), "cuDevicePrimaryCtxRetain"));
        }
        ctx = retained[device];
    }
    return cu.check(cu.ctxSetCurrent(ctx), "cuCtxSetCurrent");
}

}  // namespace mooncake::te
