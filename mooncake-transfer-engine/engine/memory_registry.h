// The local process's registered memory and the engine's shareable
// allocations. Transports consult it to bounds-check every remote write.
#pragma once

#include <cstdint>
#include <functional>
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

// Memory other local processes can map through a file descriptor: a memfd
// the engine mapped ("cpu"), or exportable device memory ("cuda:<n>").
struct SharedAllocation {
    uint64_t id = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    int fd = -1;  // owned by the registry
    std::string location = "cpu";
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
    // Takes over an fd-backed allocation made elsewhere (exportable device
    // memory): the registry owns `fd` from now on, and freeShared (or the
    // registry's destruction) closes it and then runs `release`.
    Result<SharedAllocation> adoptShared(uint64_t addr, uint64_t length, int fd,
                                         std::string location, std::function<void()> release);
    Status freeShared(uint64_t addr);
    // The shared allocation holding [addr, addr+len), if any.
    std::optional<SharedAllocation> findShared(uint64_t addr, uint64_t len) const;
    std::optional<SharedAllocation> sharedById(uint64_t id) const;

private:
    mutable std::mutex mu_;
    std::vector<LocalRegion> regions_;
    struct SharedEntry {
        SharedAllocation alloc;
        std::function<void()> release;  // empty: a memfd mapping of ours (munmap)
    };
    static void releaseEntry(SharedEntry& entry);
    std::vector<SharedEntry> shared_;
    uint64_t next_shared_id_ = 1;
};

}  // namespace mooncake::te
