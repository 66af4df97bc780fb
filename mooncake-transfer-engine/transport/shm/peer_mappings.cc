#include "mooncake-transfer-engine/transport/shm/peer_mappings.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace mooncake::te {

Result<std::shared_ptr<PeerMapping>> PeerMapping::map(const UniqueFd& fd, const ShmExport& alloc) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
        return PeerFailure(std::string("fstat of a peer memfd: ") + std::strerror(errno));
    }
    // Touching a page past the end of the file raises SIGBUS, so never map
    // more than the file holds. (The engine never shrinks its memfds.)
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < alloc.length) {
        return PeerFailure("peer memfd holds " + std::to_string(st.st_size) +
                           " bytes; its export claims " + std::to_string(alloc.length));
    }
    void* p = ::mmap(nullptr, alloc.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
        return Unavailable("mmap of " + std::to_string(alloc.length) +
                           " peer bytes: " + std::strerror(errno));
    }
    return std::shared_ptr<PeerMapping>(new PeerMapping(static_cast<char*>(p), alloc));
}

PeerMapping::~PeerMapping() {
    ::munmap(local_, alloc_.length);
}

char* PeerMapping::translate(uint64_t addr, uint64_t len) const {
    if (!alloc_.covers(addr, len))
        return nullptr;
    return local_ + (addr - alloc_.base);
}

Result<std::shared_ptr<PeerMapping>> PeerMappings::get(const std::string& key, const Opener& open) {
    std::shared_ptr<Slot> slot;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_)
            return Aborted("shm transport shut down");
        auto& s = slots_[key];
        if (!s)
            s = std::make_shared<Slot>();
        slot = s;
    }
    std::lock_guard<std::mutex> slot_lock(slot->mu);
    if (slot->mapping)
        return slot->mapping;
    MC_ASSIGN_OR_RETURN(auto mapping, open());
    std::lock_guard<std::mutex> lock(mu_);
    // A clear() that ran while we were opening must not be undone.
    if (closed_)
        return Aborted("shm transport shut down");
    slot->mapping = mapping;
    return mapping;
}

void PeerMappings::clear() {
    std::map<std::string, std::shared_ptr<Slot>> dropped;
    {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
        dropped.swap(slots_);
    }
    // Slots (and the mappings no transfer still holds) go away here, outside
    // mu_, since munmap of a large mapping is not instant.
}

}  // namespace mooncake::te
