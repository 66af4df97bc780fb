#include "mooncake-transfer-engine/transport/rdma/gpu_memory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <string>

namespace mooncake::te::rdma {

namespace {

// The few driver-API types and values used here (cuda.h, CUDA 11.7+).
using CuResult = int;
using CuDevicePtr = unsigned long long;
using CuContext = void*;
constexpr int kRangeHandleTypeDmabufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
constexpr int kPointerAttributeContext = 1;  // CU_POINTER_ATTRIBUTE_CONTEXT

struct Cuda {
    CuResult (*getHandleForAddressRange)(void*, CuDevicePtr, size_t, int, unsigned long long);
    CuResult (*pointerGetAttribute)(void*, int, CuDevicePtr);
    CuResult (*ctxSetCurrent)(CuContext);
    CuResult (*memcpy)(CuDevicePtr, CuDevicePtr, size_t);
    CuResult (*memGetAddressRange)(CuDevicePtr*, size_t*, CuDevicePtr);
    Status status;
};

const Cuda& cuda() {
    static const Cuda loaded = [] {
        Cuda c{};
        void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) {
            c.status = Unavailable("CUDA is not loaded in this process");
            return c;
        }
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
        };
        sym(c.getHandleForAddressRange, "cuMemGetHandleForAddressRange");
        sym(c.pointerGetAttribute, "cuPointerGetAttribute");
        sym(c.ctxSetCurrent, "cuCtxSetCurrent");
        sym(c.memcpy, "cuMemcpy");
        sym(c.memGetAddressRange, "cuMemGetAddressRange_v2");
        if (!c.pointerGetAttribute || !c.ctxSetCurrent || !c.memcpy || !c.memGetAddressRange)
            c.status = Unavailable("the CUDA driver lacks the pointer/copy calls");
        return c;
    }();
    return loaded;
}

Status useContextOf(const Cuda& cu, const void* device_ptr) {
    CuContext ctx = nullptr;
    CuResult rc = cu.pointerGetAttribute(&ctx, kPointerAttributeContext,
                                         reinterpret_cast<CuDevicePtr>(device_ptr));
    if (rc != 0)
        return InvalidArgument("cuPointerGetAttribute(CONTEXT) failed (" + std::to_string(rc) +
                               "): not device memory?");
    rc = cu.ctxSetCurrent(ctx);
    if (rc != 0)
        return Internal("cuCtxSetCurrent failed (" + std::to_string(rc) + ")");
    return Status::OK();
}

}  // namespace

Result<DmabufRange> exportDmabuf(uint64_t addr, uint64_t length) {
    const Cuda& cu = cuda();
    MC_RETURN_IF_ERROR(cu.status);
    if (!cu.getHandleForAddressRange)
        return Unavailable(
            "cuMemGetHandleForAddressRange is missing (CUDA driver older than 11.7)");
    MC_RETURN_IF_ERROR(useContextOf(cu, reinterpret_cast<const void*>(addr)));
    // The exported range must be page aligned and inside one allocation.
    CuDevicePtr base = 0;
    size_t size = 0;
    CuResult rc = cu.memGetAddressRange(&base, &size, addr);
    if (rc != 0)
        return Unavailable("cuMemGetAddressRange failed (" + std::to_string(rc) + ")");
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t start = addr & ~(page - 1);
    const uint64_t end = (addr + length + page - 1) & ~(page - 1);
    if (start < base || end > base + size)
        return Unavailable("device range is not page aligned within its allocation");
    int fd = -1;
    rc = cu.getHandleForAddressRange(&fd, start, end - start, kRangeHandleTypeDmabufFd, 0);
    if (rc != 0)
        return Unavailable("cuMemGetHandleForAddressRange(DMA_BUF_FD) failed (" +
                           std::to_string(rc) + "): the driver cannot export dma-bufs");
    return DmabufRange{fd, addr - start};
}

Status copyDeviceHost(void* dst, const void* src, uint64_t length, const void* device_ptr) {
    const Cuda& cu = cuda();
    MC_RETURN_IF_ERROR(cu.status);
    MC_RETURN_IF_ERROR(useContextOf(cu, device_ptr));
    CuResult rc =
        cu.memcpy(reinterpret_cast<CuDevicePtr>(dst), reinterpret_cast<CuDevicePtr>(src), length);
    if (rc != 0)
        return Internal("cuMemcpy of " + std::to_string(length) + " bytes failed (" +
                        std::to_string(rc) + ")");
    return Status::OK();
}

}  // namespace mooncake::te::rdma
