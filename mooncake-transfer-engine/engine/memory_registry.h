// The local process's registered memory and the engine's shareable
// allocations. Transports consult it to bounds-check every remote write.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

struct LocalRegion {
    uint64_t addr = 0;
    uint64_t length = 0;
    std::string location;
    bool remote_accessible = true;

    bool contains(uint64_t a, uint64_t len) const {
        return a >= addr && len <= length && a - addr <= length - len;
    }
};

// Memory the engine mapped from a memfd so other local processes can map it.
struct SharedAllocation {
    uint64_t id = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    int fd = -1;  // owned by the registry
};

class MemoryRegistry {
public:
    MemoryRegistry() = default;
    ~MemoryRegistry();
    MemoryRegistry(const MemoryRegistry&) = delete;
    MemoryRegistry& operator=(const MemoryRegistry&) = delete;

    // Fails if [addr, addr+len) overlaps an existing registration.
    Status add(const LocalRegion& region);
    Status remove(uint64_t addr);
    std::vector<LocalRegion> regions() const;

    // The region containing the range, if registered.
    std::optional<LocalRegion> find(uint64_t addr, uint64_t len) const;
    // True when the range lies in one region that peers may write or read.
    bool remotelyAccessible(uint64_t addr, uint64_t len) const;

    // memfd-backed, page-aligned, zero-filled memory.
    Result<SharedAllocation> allocateShared(uint64_t length, const std::string& debug_name);
    Status freeShared(uint64_t addr);
    // The shared allocation holding [addr, addr+len), if any.
    std::optional<SharedAllocation> findShared(uint64_t addr, uint64_t len) const;
    std::optional<SharedAllocation> sharedById(uint64_t id) const;

private:
    mutable std::mutex mu_;
    std::vector<LocalRegion> regions_;
    std::vector<SharedAllocation> shared_;
    uint64_t next_shared_id_ = 1;
};

}  // namespace mooncake::te
