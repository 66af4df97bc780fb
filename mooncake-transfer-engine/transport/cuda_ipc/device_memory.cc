#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"

#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_driver.h"

namespace mooncake::te {

namespace {

CUmemAllocationProp allocationProp(int device) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

// A reserved and mapped virtual range over a physical allocation handle; the
// destructor undoes whatever was done, in reverse order.
class Mapping {
public:
    explicit Mapping(const CudaDriver& cu) : cu_(cu) {}
    ~Mapping() {
        if (mapped_)
            (void)cu_.memUnmap(ptr_, length_);
        if (ptr_)
            (void)cu_.memAddressFree(ptr_, length_);
        if (handle_owned_)
            (void)cu_.memRelease(handle_);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;

    // Takes ownership of `handle`, maps `length` bytes of it and grants
    // `device` read-write access.
    Status map(CUmemGenericAllocationHandle handle, uint64_t length, uint64_t alignment,
               int device) {
        handle_ = handle;
        handle_owned_ = true;
        length_ = length;
        MC_RETURN_IF_ERROR(cu_.check(cu_.memAddressReserve(&ptr_, length, alignment, 0, 0),
                                     "cuMemAddressReserve(" + std::to_string(length) + ")"));
        MC_RETURN_IF_ERROR(cu_.check(cu_.memMap(ptr_, length, 0, handle, 0), "cuMemMap"));
        mapped_ = true;
        CUmemAccessDesc access{};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = device;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        return cu_.check(cu_.memSetAccess(ptr_, length, &access, 1),
                         "cuMemSetAccess(device " + std::to_string(device) + ")");
    }

    CUdeviceptr ptr() const { return ptr_; }
    uint64_t length() const { return length_; }
    CUmemGenericAllocationHandle handle() const { return handle_; }

private:
    const CudaDriver& cu_;
    CUmemGenericAllocationHandle handle_{};
    bool handle_owned_ = false;
    CUdeviceptr ptr_ = 0;
    uint64_t length_ = 0;
    bool mapped_ = false;
};

class OwnedDeviceMemory final : public ExportableDeviceMemory {
public:
    OwnedDeviceMemory(const CudaDriver& cu, int device) : cu_(cu), mapping_(cu), device_(device) {}
    Status init(uint64_t length) {
        MC_RETURN_IF_ERROR(useDevice(cu_, device_));
        CUmemAllocationProp prop = allocationProp(device_);
        size_t granularity = 0;
        MC_RETURN_IF_ERROR(cu_.check(cu_.memGetAllocationGranularity(
                                         &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                                     "cuMemGetAllocationGranularity"));
        if (granularity == 0)
            granularity = 2 << 20;
        uint64_t rounded = (length + granularity - 1) / granularity * granularity;
        CUmemGenericAllocationHandle handle{};
        MC_RETURN_IF_ERROR(cu_.check(cu_.memCreate(&handle, rounded, &prop, 0),
                                     "cuMemCreate(" + std::to_string(rounded) +
                                         " bytes on cuda:" + std::to_string(device_) + ")"));
        return mapping_.map(handle, rounded, granularity, device_);
    }

    uint64_t addr() const override { return mapping_.ptr(); }
    uint64_t length() const override { return mapping_.length(); }
    int device() const override { return device_; }
    Result<int> exportFd() const override {
        int fd = -1;
        MC_RETURN_IF_ERROR(
            cu_.check(cu_.memExportToShareableHandle(&fd, mapping_.handle(),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                      "cuMemExportToShareableHandle"));
        return fd;
    }

private:
    const CudaDriver& cu_;
    Mapping mapping_;
    int device_;
};

class PeerDeviceMemory final : public ImportedDeviceMemory {
public:
    explicit PeerDeviceMemory(const CudaDriver& cu) : mapping_(cu) {}
    Mapping& mapping() { return mapping_; }
    char* ptr() const override { return reinterpret_cast<char*>(mapping_.ptr()); }
    uint64_t length() const override { return mapping_.length(); }

private:
    Mapping mapping_;
};

}  // namespace

Status deviceMemoryAvailable() {
    return CudaDriver::get().status();
}

Result<std::unique_ptr<ExportableDeviceMemory>> allocateExportableDeviceMemory(int device,
                                                                               uint64_t length) {
    if (length == 0)
        return InvalidArgument("cannot allocate zero bytes of device memory");
    if (device < 0)
        return InvalidArgument("CUDA device ordinal " + std::to_string(device));
    MC_ASSIGN_OR_RETURN(const CudaDriver* cu, CudaDriver::get());
    auto memory = std::make_unique<OwnedDeviceMemory>(*cu, device);
    MC_RETURN_IF_ERROR(memory->init(length));
    return std::unique_ptr<ExportableDeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<ImportedDeviceMemory>> importDeviceMemory(int fd, uint64_t length,
                                                                 int device) {
    MC_ASSIGN_OR_RETURN(const CudaDriver* cu, CudaDriver::get());
    MC_RETURN_IF_ERROR(useDevice(*cu, device));
    CUmemGenericAllocationHandle handle{};
    // The driver reads the descriptor's number from the pointer argument.
    void* os_handle = reinterpret_cast<void*>(static_cast<intptr_t>(fd));
    MC_RETURN_IF_ERROR(cu->check(cu->memImportFromShareableHandle(
                                     &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                                 "cuMemImportFromShareableHandle"));
    auto memory = std::make_unique<PeerDeviceMemory>(*cu);
    CUmemAllocationProp prop = allocationProp(device);
    size_t granularity = 0;
    Status st = cu->check(
        cu->memGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
    if (!st.ok()) {
        (void)cu->memRelease(handle);
        return st;
    }
    MC_RETURN_IF_ERROR(memory->mapping().map(handle, length, granularity, device));
    return std::unique_ptr<ImportedDeviceMemory>(std::move(memory));
}

}  // namespace mooncake::te
