#include "mooncake-pg/device/peer_buffers.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_driver.h"

namespace mooncake::pg::device {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "the descriptor holds one handle");

Result<BufferDescriptor> BufferExports::describe(const void* ptr, uint64_t bytes) {
    MC_ASSIGN_OR_RETURN(const te::CudaDriver* cu, te::CudaDriver::get());
    const auto dptr = reinterpret_cast<CUdeviceptr>(ptr);
    CUmemorytype type{};
    if (cu->pointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE)
        return BufferDescriptor{};
    unsigned long long id = 0;  // NOLINT(runtime/int): the attribute's type
    CUdeviceptr start = 0;
    size_t range = 0;
    MC_RETURN_IF_ERROR(cu->check(cu->pointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, dptr),
                                 "reading a buffer's allocation id"));
    MC_RETURN_IF_ERROR(
        cu->check(cu->pointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr),
                  "reading a buffer's allocation start"));
    MC_RETURN_IF_ERROR(
        cu->check(cu->pointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr),
                  "reading a buffer's allocation size"));
    if (dptr + bytes > start + range) {
        return InvalidArgument("a buffer of " + std::to_string(bytes) + " bytes at offset " +
                               std::to_string(dptr - start) + " overruns its allocation of " +
                               std::to_string(range) + " bytes");
    }
    auto it = by_id_.find(id);
    if (it == by_id_.end()) {
        BufferDescriptor d;
        cudaIpcMemHandle_t handle;
        if (cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(start)) != cudaSuccess) {
            // Not from cudaMalloc (cuMem-backed, e.g. expandable segments).
            (void)cudaGetLastError();
            d.allocation_id = 0;
        } else {
            d.allocation_id = id;
            d.allocation_bytes = range;
            std::memcpy(d.ipc_handle, &handle, sizeof(handle));
        }
        if (by_id_.size() >= kMaxEntries)
            by_id_.clear();
        it = by_id_.emplace(id, d).first;
    }
    BufferDescriptor d = it->second;
    if (d.allocation_id != 0)
        d.offset = dptr - start;
    return d;
}

Result<char*> PeerBufferMappings::map(const std::string& peer, const BufferDescriptor& d,
                                      uint64_t bytes) {
    // The descriptor comes from another process: checked before any use.
    if (d.allocation_id == 0 || d.offset > d.allocation_bytes ||
        bytes > d.allocation_bytes - d.offset) {
        return InvalidArgument("peer " + peer + " described a buffer of " + std::to_string(bytes) +
                               " bytes at offset " + std::to_string(d.offset) +
                               " of an allocation of " + std::to_string(d.allocation_bytes) +
                               " bytes (id " + std::to_string(d.allocation_id) + ")");
    }
    const auto key = std::make_pair(peer, d.allocation_id);
    auto it = mapped_.find(key);
    if (it == mapped_.end()) {
        cudaIpcMemHandle_t handle;
        std::memcpy(&handle, d.ipc_handle, sizeof(handle));
        void* base = nullptr;
        const cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return Internal("mapping an allocation of peer " + peer + " (id " +
                            std::to_string(d.allocation_id) + "): " + cudaGetErrorString(e));
        }
        it = mapped_.emplace(key, Mapping{static_cast<char*>(base), d.allocation_bytes}).first;
    } else if (it->second.bytes != d.allocation_bytes) {
        return InvalidArgument("peer " + peer + " described allocation " +
                               std::to_string(d.allocation_id) + " as " +
                               std::to_string(d.allocation_bytes) + " bytes, mapped as " +
                               std::to_string(it->second.bytes));
    }
    return it->second.base + d.offset;
}

void PeerBufferMappings::clear() {
    for (auto& [key, m] : mapped_)
        (void)cudaIpcCloseMemHandle(m.base);
    mapped_.clear();
}

}  // namespace mooncake::pg::device
