// Message-oriented abstract-namespace unix sockets that can carry one file
// descriptor per message (SCM_RIGHTS). The shm transport hands memfds to
// same-host peers over them. SOCK_SEQPACKET keeps message boundaries, so a
// request is always read whole and no framing state survives between calls.
// Every call that can block takes a Deadline.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
    UniqueFd& operator=(UniqueFd&& o) noexcept {
        if (this != &o)
            reset(o.release());
        return *this;
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    int release() {
        int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset(int fd = -1);

private:
    int fd_ = -1;
};

// Longest abstract socket name (sun_path minus the leading NUL).
inline constexpr size_t kMaxAbstractNameLength = 107;

// A non-blocking listening socket bound to the abstract name `name`.
Result<UniqueFd> listenAbstract(const std::string& name, int backlog);

// A non-blocking socket connected to the abstract name `name`. A name nobody
// listens on fails at once (kUnavailable), which is how a dead peer shows.
Result<UniqueFd> connectAbstract(const std::string& name, Deadline deadline);

// Sends one message, passing `pass_fd` along with it when it is >= 0.
Status sendPacket(int sock, std::string_view bytes, int pass_fd, Deadline deadline);

struct Packet {
    std::string bytes;
    UniqueFd fd;  // the descriptor passed with the message, if any
};

// Receives one message of at most `max_bytes`; a longer one is an error, as
// is more than one passed descriptor. EOF is kPeerFailure.
Result<Packet> recvPacket(int sock, size_t max_bytes, Deadline deadline);

// The pid of the process at the other end of a unix socket, or -1.
int peerPid(int sock);

}  // namespace mooncake::te
