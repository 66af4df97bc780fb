// What a group keeps for P2P on CUDA tensors over device pools
// (cuda_p2p.cc), created at the group's first such op: a second P2P engine,
// its rings in the host window at `window_offset`, its pools in device
// memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "mooncake-pg/device/routing.h"

namespace mooncake::pg {

class P2PEngine;
namespace device {
class DevicePools;
}  // namespace device

struct CudaP2P {
    std::mutex mu;  // guards creating the engine and taking it down
    // Serializes giving the engine views (held while its setMembership
    // completes ops, never while creating or taking it down).
    std::mutex apply_mu;
    uint64_t window_offset = 0;
    uint64_t pool_bytes = device::kDefaultP2PPoolBytes;  // MC_PG_CUDA_P2P_POOL_BYTES
    bool copy_with_kernel = false;                       // MC_PG_CUDA_P2P_COPY
    // The group's route, as rank 0 published it: -1 not read yet, 0 staged,
    // 1 device pools.
    std::atomic<int> route{-1};
    std::shared_ptr<device::DevicePools> pools;
    // Shared: applying a view holds it, so a completion that lets the group
    // go cannot destroy it under its own setMembership.
    std::shared_ptr<P2PEngine> engine;
    std::atomic<P2PEngine*> engine_ptr{nullptr};
    std::atomic<uint64_t> ops{0};
};

}  // namespace mooncake::pg
