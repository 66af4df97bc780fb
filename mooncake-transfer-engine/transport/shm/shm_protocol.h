// What the shm transport publishes per region and says over its unix socket.
//
// RegionDesc.shm_export names the engine shared allocation (memfd) holding
// the region, with the allocation's bounds in the owner's address space, so
// a peer can translate any address of the region into its own mapping and
// bounds-check it without asking the owner again.
//
// The socket speaks one request/reply per message (SOCK_SEQPACKET):
//   request: magic, version, op, allocation id, group secret
//   reply:   magic, version, code, allocation length [+ memfd via SCM_RIGHTS]
// A client may send several requests on one connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/shm/fd_passing.h"

namespace mooncake::te {

struct ShmExport {
    uint64_t alloc_id = 0;
    uint64_t base = 0;    // allocation start in the owner's address space
    uint64_t length = 0;  // allocation length (page multiple)

    // True when [addr, addr+len) lies inside the allocation.
    bool covers(uint64_t addr, uint64_t len) const {
        return addr >= base && len <= length && addr - base <= length - len;
    }
};

std::string encodeShmExport(const ShmExport& e);
// Rejects malformed bytes and allocations that wrap around the address space.
Result<ShmExport> decodeShmExport(std::string_view bytes);

enum class ShmOp : uint8_t {
    kPing = 1,            // liveness + secret check only
    kOpenAllocation = 2,  // reply carries the allocation's memfd
};

enum class ShmReplyCode : uint8_t {
    kOk = 0,
    kDenied = 1,      // wrong secret
    kNotFound = 2,    // no such allocation, or none of it is remotely accessible
    kBadRequest = 3,  // malformed request
    kInternal = 4,    // the owner could not hand the descriptor out
};

struct ShmRequest {
    ShmOp op = ShmOp::kPing;
    uint64_t alloc_id = 0;
    std::string secret;
};

struct ShmReply {
    ShmReplyCode code = ShmReplyCode::kOk;
    uint64_t length = 0;  // allocation length for kOpenAllocation
};

inline constexpr size_t kMaxShmSecretBytes = 4096;
inline constexpr size_t kMaxShmRequestBytes = kMaxShmSecretBytes + 64;
inline constexpr size_t kMaxShmReplyBytes = 64;

std::string encodeShmRequest(const ShmRequest& r);
Result<ShmRequest> decodeShmRequest(std::string_view bytes);
std::string encodeShmReply(const ShmReply& r);
Result<ShmReply> decodeShmReply(std::string_view bytes);

// Client side: connects to the abstract socket `socket_name`, sends `request`
// and returns the reply's descriptor (invalid for kPing). A non-kOk reply is
// turned into the matching Status.
Result<UniqueFd> shmCall(const std::string& socket_name, const ShmRequest& request,
                         Deadline deadline, uint64_t* length_out);

}  // namespace mooncake::te
