// Same-host device memory: peers map each other's exportable device
// allocations (device_memory.h) and copy with the copy engines, or hand the
// mapped pointer to kernels (mapPeerMemory). Several processes on one GPU
// work the same way as processes on different GPUs of one host.
#pragma once

#include <memory>

#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

// nullptr when this process cannot use CUDA (no driver, no device, built
// without CUDA); the reason is logged once.
std::unique_ptr<Transport> createCudaIpcTransport();

}  // namespace mooncake::te
