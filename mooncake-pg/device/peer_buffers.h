// Sharing the members' own buffers for the direct collectives: a member
// describes the allocation behind a buffer (a CUDA IPC handle, its unique
// id, the buffer's offset), the peers map that allocation once and find the
// buffer in it on every later call. The descriptors travel through the host
// core's exchange among the group's members, never through a listener: an
// IPC handle lets any process of the user that holds it map the memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr int kIpcHandleBytes = 64;

// Fixed layout: exchanged as bytes between processes of one build.
struct BufferDescriptor {
    // The allocation's process-wide unique id; 0: this buffer cannot be
    // shared (memory not from cudaMalloc, e.g. cuMem-backed or managed).
    uint64_t allocation_id = 0;
    uint64_t allocation_bytes = 0;
    uint64_t offset = 0;  // of the buffer in its allocation
    char ipc_handle[kIpcHandleBytes] = {};
};

// The descriptors of this process's buffers, cached per allocation (a
// handle costs a driver call; ids are never reused within a process).
class BufferExports {
public:
    // Describes [ptr, ptr + bytes) on the current device. A buffer that
    // cannot be shared gets allocation_id 0 (not an error: the call then
    // takes the staged path on every rank); kInternal for CUDA failures.
    Result<BufferDescriptor> describe(const void* ptr, uint64_t bytes);

private:
    // Bounded: allocations freed by the caching allocator leave stale entries.
    static constexpr size_t kMaxEntries = 1024;
    std::map<uint64_t, BufferDescriptor> by_id_;
};

// Peers' allocations mapped in this process, by (peer, allocation id). A
// peer is named by a string unique to its process (its segment), so a
// restarted peer's ids never hit an old mapping.
class PeerBufferMappings {
public:
    PeerBufferMappings() = default;
    PeerBufferMappings(const PeerBufferMappings&) = delete;
    PeerBufferMappings& operator=(const PeerBufferMappings&) = delete;
    ~PeerBufferMappings() { clear(); }

    // The peer's buffer of `bytes` described by `d`, mapped at first use.
    // kInvalidArgument when the buffer does not lie inside the allocation
    // the descriptor names; kInternal when the mapping fails.
    Result<char*> map(const std::string& peer, const BufferDescriptor& d, uint64_t bytes);
    size_t size() const { return mapped_.size(); }
    // Unmaps everything: no queued kernel may still read a mapping.
    void clear();

private:
    struct Mapping {
        char* base = nullptr;
        uint64_t bytes = 0;
    };
    std::map<std::pair<std::string, uint64_t>, Mapping> mapped_;
};

}  // namespace mooncake::pg::device
