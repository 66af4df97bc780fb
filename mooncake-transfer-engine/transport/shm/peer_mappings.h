// The peer side of the shm transport: a cache of peers' shared allocations
// mapped into this process, one mapping per (peer process, allocation).
//
// A mapping holds its own reference on the peer's memfd, so it stays valid
// after the peer frees the allocation or dies: stores land in orphaned pages
// instead of raising SIGBUS. Mappings live until clear() (transport shutdown);
// pointers handed out by mapPeerMemory are valid until then.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/shm/fd_passing.h"
#include "mooncake-transfer-engine/transport/shm/shm_protocol.h"

namespace mooncake::te {

// One peer allocation mapped read/write. Unmapped on destruction, so a
// transfer that holds the shared_ptr can finish even if the cache is cleared.
class PeerMapping {
public:
    // Maps the whole memfd `fd`, which must be at least `alloc.length` bytes.
    static Result<std::shared_ptr<PeerMapping>> map(const UniqueFd& fd, const ShmExport& alloc);

    ~PeerMapping();
    PeerMapping(const PeerMapping&) = delete;
    PeerMapping& operator=(const PeerMapping&) = delete;

    const ShmExport& alloc() const { return alloc_; }
    // Where the peer's [addr, addr+len) lives in this process, or nullptr
    // when the range is not inside the mapped allocation.
    char* translate(uint64_t addr, uint64_t len) const;

private:
    PeerMapping(char* local, const ShmExport& alloc) : local_(local), alloc_(alloc) {}
    char* local_;
    ShmExport alloc_;
};

class PeerMappings {
public:
    using Opener = std::function<Result<std::shared_ptr<PeerMapping>>()>;

    // The cached mapping for `key`, or the one `open` produces (then cached).
    // Concurrent callers for one key share a single open; callers for other
    // keys are not held up by it. A failed open is not cached.
    Result<std::shared_ptr<PeerMapping>> get(const std::string& key, const Opener& open);

    // Drops every mapping; later get() calls fail with kAborted.
    void clear();

private:
    struct Slot {
        std::mutex mu;  // held while opening, so one open per key runs at a time
        std::shared_ptr<PeerMapping> mapping;
    };

    // Guards slots_ and closed_. Never held while waiting for a Slot::mu.
    std::mutex mu_;
    std::map<std::string, std::shared_ptr<Slot>> slots_;
    bool closed_ = false;
};

}  // namespace mooncake::te
