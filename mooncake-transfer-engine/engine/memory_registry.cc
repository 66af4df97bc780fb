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

RegionUse::RegionUse(RegionUse&& other) noexcept
    : registry_(other.registry_), region_addr_(other.region_addr_) {
    other.registry_ = nullptr;
}

RegionUse& RegionUse::operator=(RegionUse&& other) noexcept {
    if (this != &other) {
        release();
        registry_ = other.registry_;
        region_addr_ = other.region_addr_;
        other.registry_ = nullptr;
    }
    return *this;
}

void RegionUse::release() {
    if (registry_)
        registry_->endRemoteUse(region_addr_);
    registry_ = nullptr;
}

MemoryRegistry::RegionEntry* MemoryRegistry::entryAt(uint64_t addr) {
    for (auto& e : regions_) {
        if (e.region.addr == addr)
            return &e;
    }
    return nullptr;
}

Status MemoryRegistry::add(const LocalRegion& region) {
    if (region.length == 0)
        return InvalidArgument("cannot register a zero-length region");
    if (region.addr + region.length < region.addr) {
        return InvalidArgument("region wraps around the address space");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : regions_) {
        const LocalRegion& r = e.region;
        bool disjoint = region.addr + region.length <= r.addr || r.addr + r.length <= region.addr;
        if (!disjoint) {
            return InvalidArgument("region [" + std::to_string(region.addr) + ", +" +
                                   std::to_string(region.length) +
                                   ") overlaps a registered region at " + std::to_string(r.addr) +
                                   (e.removing ? " (still being unregistered)" : ""));
        }
    }
    regions_.push_back({region, 0, false});
    return Status::OK();
}

Result<LocalRegion> MemoryRegistry::beginRemove(uint64_t addr) {
    std::lock_guard<std::mutex> lock(mu_);
    RegionEntry* e = entryAt(addr);
    if (!e)
        return NotFound("no region registered at address " + std::to_string(addr));
    e->removing = true;
    return e->region;
}

Status MemoryRegistry::finishRemove(uint64_t addr, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        RegionEntry* e = entryAt(addr);
        if (!e || !e->removing)
            return NotFound("no region being unregistered at address " + std::to_string(addr));
        if (e->uses == 0) {
            regions_.erase(regions_.begin() + (e - regions_.data()));
            return Status::OK();
        }
        if (deadline.expired()) {
            return Timeout("unregistering region [" + std::to_string(addr) + ", +" +
                           std::to_string(e->region.length) + "): " + std::to_string(e->uses) +
                           " remote write(s) still landing in it at the deadline; the region "
                           "stays registered (refusing new writes) and must not be freed yet");
        }
        if (deadline.at() == Deadline::Clock::time_point::max())
            uses_done_.wait(lock);
        else
            uses_done_.wait_until(lock, deadline.at());
    }
}

Status MemoryRegistry::remove(uint64_t addr, Deadline deadline) {
    MC_RETURN_IF_ERROR(beginRemove(addr).status());
    return finishRemove(addr, deadline);
}

std::vector<LocalRegion> MemoryRegistry::regions() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<LocalRegion> out;
    for (const auto& e : regions_) {
        if (!e.removing)
            out.push_back(e.region);
    }
    return out;
}

std::optional<LocalRegion> MemoryRegistry::find(uint64_t addr, uint64_t len) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : regions_) {
        if (!e.removing && e.region.contains(addr, len))
            return e.region;
    }
    return std::nullopt;
}

bool MemoryRegistry::remotelyAccessible(uint64_t addr, uint64_t len) const {
    auto r = find(addr, len);
    return r && r->remote_accessible;
}

Result<RegionUse> MemoryRegistry::beginRemoteUse(uint64_t addr, uint64_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : regions_) {
        if (!e.region.contains(addr, len))
            continue;
        if (e.removing || !e.region.remote_accessible)
            break;
        ++e.uses;
        return RegionUse(this, e.region.addr);
    }
    return OutOfRange("[" + std::to_string(addr) + ", +" + std::to_string(len) +
                      ") is not inside a remotely accessible region");
}

uint32_t MemoryRegistry::remoteUses(uint64_t addr) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : regions_) {
        if (e.region.addr == addr)
            return e.uses;
    }
    return 0;
}

void MemoryRegistry::endRemoteUse(uint64_t region_addr) {
    std::lock_guard<std::mutex> lock(mu_);
    RegionEntry* e = entryAt(region_addr);
    // A use pins its region: it cannot have been erased meanwhile.
    if (e && e->uses > 0 && --e->uses == 0 && e->removing)
        uses_done_.notify_all();
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
