// Built instead of the cuda_ipc transport when CUDA support is off.
#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_ipc_transport.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"

namespace mooncake::te {

namespace {
Status notBuilt() {
    return Unavailable("built without CUDA support (USE_CUDA=OFF)");
}
}  // namespace

std::unique_ptr<Transport> createCudaIpcTransport() {
    return nullptr;
}

Status deviceMemoryAvailable() {
    return notBuilt();
}

Result<std::unique_ptr<ExportableDeviceMemory>> allocateExportableDeviceMemory(int, uint64_t) {
    return notBuilt();
}

Result<std::unique_ptr<ImportedDeviceMemory>> importDeviceMemory(int, uint64_t, int) {
    return notBuilt();
}

}  // namespace mooncake::te
