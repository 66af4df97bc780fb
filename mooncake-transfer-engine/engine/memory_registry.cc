#include "mooncake-transfer-engine/engine/memory_registry.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mooncake::te {

MemoryRegistry::~MemoryRegistry() {
    for (auto& s : shared_)
        releaseEntry(s);
}

void MemoryRegistry::releaseEntry(SharedEntry& entry) {
    if (entry.alloc.fd >= 0)
        ::close(entry.alloc.fd);
    if (entry.release) {
        entry.release();
    } else {
        ::munmap(reinterpret_cast<void*>(entry.alloc.addr), entry.alloc.length);
    }
}

Status MemoryRegistry::add(const LocalRegion& region) {
    if (region.length == 0)
        return InvalidArgument("cannot register a zero-length region");
    if (region.addr + region.length < region.addr) {
        return InvalidArgument("region wraps around the address space");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : regions_) {
        bool disjoint = region.addr + region.length <= r.addr || r.addr + r.length <= region.addr;
        if (!disjoint) {
            return InvalidArgument("region [" + std::to_string(region.addr) + ", +" +
                                   std::to_string(region.length) +
                                   ") overlaps a registered region at " + std::to_string(r.addr));
        }
    }
    regions_.push_back(region);
    return Status::OK();
}

Status MemoryRegistry::remove(uint64_t addr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const LocalRegion& r) { return r.addr == addr; });
    if (it == regions_.end()) {
        return NotFound("no region registered at address " + std::to_string(addr));
    }
    regions_.erase(it);
    return Status::OK();
}

std::vector<LocalRegion> MemoryRegistry::regions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return regions_;
}

std::optional<LocalRegion> MemoryRegistry::find(uint64_t addr, uint64_t len) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& r : regions_) {
        if (r.contains(addr, len))
            return r;
    }
    return std::nullopt;
}

bool MemoryRegistry::remotelyAccessible(uint64_t addr, uint64_t len) const {
    auto r = find(addr, len);
    return r && r->remote_accessible;
}

Result<SharedAllocation> MemoryRegistry::allocateShared(uint64_t length,
                                                        const std::string& debug_name) {
    if (length == 0)
        return InvalidArgument("cannot allocate zero bytes of shared memory");
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t rounded = (length + page - 1) / page * page;
    int fd = ::memfd_create(("mooncake:" + debug_name).c_str(), MFD_CLOEXEC);
    if (fd < 0)
        return Unavailable(std::string("memfd_create: ") + std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
        int err = errno;
        ::close(fd);
        return Unavailable("ftruncate(" + std::to_string(rounded) + "): " + std::strerror(err));
    }
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        return Unavailable("mmap(" + std::to_string(rounded) + "): " + std::strerror(err));
    }
    std::lock_guard<std::mutex> lock(mu_);
    SharedAllocation a{next_shared_id_++, reinterpret_cast<uint64_t>(p), rounded, fd, "cpu"};
    shared_.push_back({a, nullptr});
    return a;
}

Result<SharedAllocation> MemoryRegistry::adoptShared(uint64_t addr, uint64_t length, int fd,
                                                     std::string location,
                                                     std::function<void()> release) {
    if (length == 0 || fd < 0 || !release) {
        if (fd >= 0)
            ::close(fd);
        if (release)
            release();
        return InvalidArgument("adoptShared needs a length, a descriptor and a release");
    }
    std::lock_guard<std::mutex> lock(mu_);
    SharedAllocation a{next_shared_id_++, addr, length, fd, std::move(location)};
    shared_.push_back({a, std::move(release)});
    return a;
}

Status MemoryRegistry::freeShared(uint64_t addr) {
    SharedEntry entry;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = std::find_if(shared_.begin(), shared_.end(),
                               [&](const SharedEntry& s) { return s.alloc.addr == addr; });
        if (it == shared_.end())
            return NotFound("no shared allocation at " + std::to_string(addr));
        entry = std::move(*it);
        shared_.erase(it);
        // The descriptor is closed under the lock so the shm server's
        // dup-then-recheck never hands out a recycled descriptor number.
        ::close(entry.alloc.fd);
        entry.alloc.fd = -1;
    }
    // A device release may block on the driver: not under the lock.
    releaseEntry(entry);
    return Status::OK();
}

std::optional<SharedAllocation> MemoryRegistry::findShared(uint64_t addr, uint64_t len) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : shared_) {
        const SharedAllocation& s = e.alloc;
        if (addr >= s.addr && len <= s.length && addr - s.addr <= s.length - len)
            return s;
    }
    return std::nullopt;
}

std::optional<SharedAllocation> MemoryRegistry::sharedById(uint64_t id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : shared_) {
        if (e.alloc.id == id)
            return e.alloc;
    }
    return std::nullopt;
}

}  // namespace mooncake::te
