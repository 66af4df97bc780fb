#include "mooncake-transfer-engine/transport/shm/fd_passing.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <vector>

namespace mooncake::te {

namespace {

std::string errnoText(const char* what, int err) {
    return std::string(what) + ": " + std::strerror(err);
}

Result<socklen_t> abstractAddress(const std::string& name, sockaddr_un* addr) {
    if (name.empty() || name.size() > kMaxAbstractNameLength) {
        return InvalidArgument("abstract socket name of " + std::to_string(name.size()) +
                               " bytes (want 1.." + std::to_string(kMaxAbstractNameLength) + ")");
    }
    std::memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    // sun_path[0] stays NUL: that selects the abstract namespace, which needs
    // no file cleanup and vanishes with the process that holds it.
    std::memcpy(addr->sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Waits until `sock` is ready for `events`; kTimeout when the deadline passes.
Status waitReady(int sock, short events, Deadline deadline, const char* what) {
    while (true) {
        pollfd p{sock, events, 0};
        int n = ::poll(&p, 1, deadline.remainingMsForPoll());
        if (n > 0)
            return Status::OK();
        if (n == 0)
            return Timeout(std::string(what) + " did not finish before the deadline");
        if (errno != EINTR)
            return Internal(errnoText("poll", errno));
    }
}

void setTimeout(int sock, int option, Deadline deadline) {
    timeval tv{0, 0};  // zero means "no timeout" to the kernel
    auto left = deadline.remaining();
    if (left != std::chrono::nanoseconds::max()) {
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(left).count();
        if (us < 1000)
            us = 1000;  // an expired deadline must not turn into "forever"
        tv.tv_sec = static_cast<time_t>(us / 1000000);
        tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
    }
    (void)::setsockopt(sock, SOL_SOCKET, option, &tv, sizeof(tv));
}

}  // namespace

void UniqueFd::reset(int fd) {
    if (fd_ >= 0)
        ::close(fd_);
    fd_ = fd;
}

Result<UniqueFd> listenAbstract(const std::string& name, int backlog) {
    sockaddr_un addr;
    MC_ASSIGN_OR_RETURN(socklen_t len, abstractAddress(name, &addr));
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid())
        return Unavailable(errnoText("socket(AF_UNIX)", errno));
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        return Unavailable(errnoText("bind(abstract unix socket)", errno));
    }
    if (::listen(fd.get(), backlog) != 0)
        return Unavailable(errnoText("listen", errno));
    return fd;
}

Result<UniqueFd> connectAbstract(const std::string& name, Deadline deadline) {
    sockaddr_un addr;
    MC_ASSIGN_OR_RETURN(socklen_t len, abstractAddress(name, &addr));
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!fd.valid())
        return Unavailable(errnoText("socket(AF_UNIX)", errno));
    // A unix connect only blocks while the listener's backlog is full; a
    // non-blocking one would then need a retry loop, whereas SO_SNDTIMEO bounds
    // the blocking one by the deadline.
    setTimeout(fd.get(), SO_SNDTIMEO, deadline);
    while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        int err = errno;
        if (err == EINTR && !deadline.expired())
            continue;
        if (err == EISCONN)
            break;
        if (err == EAGAIN || err == EINTR) {
            return Timeout("connect to @" + name + " did not finish before the deadline");
        }
        if (err == ECONNREFUSED || err == ENOENT) {
            return Unavailable("nobody listens on @" + name + " (peer gone?)");
        }
        return Unavailable(errnoText(("connect to @" + name).c_str(), err));
    }
    int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
        return Internal(errnoText("fcntl(O_NONBLOCK)", errno));
    }
    return fd;
}

Status sendPacket(int sock, std::string_view bytes, int pass_fd, Deadline deadline) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (pass_fd >= 0) {
        std::memset(control, 0, sizeof(control));
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    while (true) {
        ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0)
            return Status::OK();  // SOCK_SEQPACKET sends a message whole or not at all
        int err = errno;
        if (err == EINTR)
            continue;
        if (err != EAGAIN && err != EWOULDBLOCK) {
            return PeerFailure(errnoText("sendmsg on unix socket", err));
        }
        MC_RETURN_IF_ERROR(waitReady(sock, POLLOUT, deadline, "sendmsg"));
    }
}

Result<Packet> recvPacket(int sock, size_t max_bytes, Deadline deadline) {
    std::vector<char> buf(max_bytes);
    // Room for a few descriptors so a peer sending too many is detected and
    // every one of them is closed, instead of leaking into this process.
    constexpr size_t kMaxFds = 4;
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))];
    while (true) {
        iovec iov{buf.data(), buf.size()};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            int err = errno;
            if (err == EINTR)
                continue;
            if (err != EAGAIN && err != EWOULDBLOCK) {
                return PeerFailure(errnoText("recvmsg on unix socket", err));
            }
            MC_RETURN_IF_ERROR(waitReady(sock, POLLIN, deadline, "recvmsg"));
            continue;
        }
        std::vector<UniqueFd> fds;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; ++i) {
                int fd = -1;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                fds.emplace_back(fd);
            }
        }
        if (n == 0 && fds.empty())
            return PeerFailure("unix socket closed by the peer");
        if (msg.msg_flags & MSG_TRUNC) {
            return InvalidArgument("message longer than " + std::to_string(max_bytes) + " bytes");
        }
        if ((msg.msg_flags & MSG_CTRUNC) || fds.size() > 1) {
            return InvalidArgument("message carried more than one descriptor");
        }
        Packet p;
        p.bytes.assign(buf.data(), static_cast<size_t>(n));
        if (!fds.empty())
            p.fd = std::move(fds.front());
        return p;
    }
}

int peerPid(int sock) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return -1;
    return static_cast<int>(cred.pid);
}

}  // namespace mooncake::te
