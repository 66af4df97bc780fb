// The local process's registered memory and the engine's shareable
// allocations. Transports consult it to bounds-check every remote write.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

class MemoryRegistry;

struct LocalRegion {
    uint64_t addr = 0;
    uint64_t length = 0;
    std::string location;
    bool remote_accessible = true;

    bool contains(uint64_t a, uint64_t len) const {
        return a >= addr && len <= length && a - addr <= length - len;
    }
};

// A peer's access to one registered region in progress (a remote WRITE
// landing in it). While any is held, removing that region waits: the
// transport copies into the region through a raw pointer, which must not
// outlive the registration. Move-only; released on destruction.
class RegionUse {
public:
    RegionUse() = default;
    RegionUse(RegionUse&& other) noexcept;
    RegionUse& operator=(RegionUse&& other) noexcept;
    ~RegionUse() { release(); }

    bool held() const { return registry_ != nullptr; }
    uint64_t regionAddr() const { return region_addr_; }
    void release();

private:
    friend class MemoryRegistry;
    RegionUse(MemoryRegistry* registry, uint64_t region_addr)
        : registry_(registry), region_addr_(region_addr) {}

    MemoryRegistry* registry_ = nullptr;
    uint64_t region_addr_ = 0;
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

    // Fails if [addr, addr+len) overlaps an existing registration (one
    // being removed included: peers may still be writing into it).
    Status add(const LocalRegion& region);
    // Removal in two steps, so that the caller can abort the accesses in
    // flight in between: beginRemove refuses new remote uses of the region
    // at `addr` (and hides it from find/regions); finishRemove waits until
    // the uses taken before are released, then forgets the region. At the
    // deadline it fails with kTimeout and the region stays refused but
    // registered: its memory must not be freed yet, and a later
    // finishRemove may complete the removal.
    Result<LocalRegion> beginRemove(uint64_t addr);
    Status finishRemove(uint64_t addr, Deadline deadline);
    // Both steps, for callers with no access to abort.
    Status remove(uint64_t addr, Deadline deadline);
    std::vector<LocalRegion> regions() const;

    // The region containing the range, if registered.
    std::optional<LocalRegion> find(uint64_t addr, uint64_t len) const;
    // True when the range lies in one region that peers may write or read.
    bool remotelyAccessible(uint64_t addr, uint64_t len) const;
    // A use of the region holding the range, taken atomically with the
    // check that the range lies in one remotely accessible region that is
    // not being removed; kOutOfRange otherwise.
    Result<RegionUse> beginRemoteUse(uint64_t addr, uint64_t len);
    // Uses held now on the region at `addr` (0 when none is registered there).
    uint32_t remoteUses(uint64_t addr) const;

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
    friend class RegionUse;
    void endRemoteUse(uint64_t region_addr);

    struct RegionEntry {
        LocalRegion region;
        uint32_t uses = 0;
        bool removing = false;
    };
    RegionEntry* entryAt(uint64_t addr);  // expects mu_ held

    mutable std::mutex mu_;
    std::condition_variable uses_done_;  // a region's last use ended; with mu_
    std::vector<RegionEntry> regions_;
    struct SharedEntry {
        SharedAllocation alloc;
        std::function<void()> release;  // empty: a memfd mapping of ours (munmap)
    };
    static void releaseEntry(SharedEntry& entry);
    std::vector<SharedEntry> shared_;
    uint64_t next_shared_id_ = 1;
};

}  // namespace mooncake::te
