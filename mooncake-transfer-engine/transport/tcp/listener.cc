#include "mooncake-transfer-engine/transport/tcp/listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::te::tcp {
namespace {

// Congestion control of the transport's sockets; empty keeps the system's
// (net.ipv4.tcp_congestion_control). Over loopback BBR keeps the window near
// a couple of 64 KiB segments and paces, so a large WRITE runs at about half
// of what the same socket does with reno or cubic (docs/transfer-engine.md).
// Unprivileged processes may pick only what
// net.ipv4.tcp_allowed_congestion_control lists.
const std::string& congestionControl() {
    static const std::string value = envString("MC_TCP_CONGESTION", "");
    return value;
}

}  // namespace

Status setSocketOptions(int fd) {
    int one = 1;
    // Requests are small frames pipelined behind each other; Nagle would hold
    // a COMPLETION or a flag WRITE back for a round trip.
    if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        return Internal(std::string("setsockopt(TCP_NODELAY): ") + std::strerror(errno));
    }
    // Keepalive notices a peer host that vanished without a FIN or RST.
    (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    const std::string& cc = congestionControl();
    if (!cc.empty() && ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc.data(),
                                    static_cast<socklen_t>(cc.size())) != 0) {
        // A knob that does not apply must not cut the transport off.
        static std::once_flag warned;
        const int err = errno;
        std::call_once(warned, [&] {
            MC_LOG(kWarn, "tcp") << "MC_TCP_CONGESTION=" << cc << " not applied ("
                                 << std::strerror(err) << "); using the system default";
        });
    }
    return Status::OK();
}

std::string describeSockaddr(const void* addr, unsigned len) {
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (::getnameinfo(static_cast<const sockaddr*>(addr), len, host, sizeof(host), serv,
                      sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        return "?";
    }
    return std::string(host) + ":" + serv;
}

Status Listener::open(const std::string& host) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), "0", &hints, &res);
    if (rc != 0)
        return InvalidArgument("resolving listen address '" + host + "': " + gai_strerror(rc));
    Status last = Unavailable("no address to listen on for '" + host + "'");
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = Internal(std::string("socket: ") + std::strerror(errno));
            continue;
        }
        int one = 1;
        (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
            last = Unavailable("binding " + host + ": " + std::strerror(errno));
            ::close(fd);
            continue;
        }
        sockaddr_storage bound{};
        socklen_t bound_len = sizeof(bound);
        if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
            last = Internal(std::string("getsockname: ") + std::strerror(errno));
            ::close(fd);
            continue;
        }
        port_ =
            ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
        fd_ = fd;
        break;
    }
    ::freeaddrinfo(res);
    if (fd_ < 0)
        return last;
    Status st = loop_->watch(fd_, EPOLLIN, this);
    if (!st.ok()) {
        close();
        return st.withContext("watching the tcp listener");
    }
    MC_LOG(kDebug, "tcp") << "listening on " << host << ":" << port_;
    return Status::OK();
}

void Listener::close() {
    if (fd_ < 0)
        return;
    loop_->unwatch(fd_);
    ::close(fd_);
    fd_ = -1;
}

void Listener::handleEvents(uint32_t events) {
    (void)events;
    while (fd_ >= 0) {
        sockaddr_storage peer{};
        socklen_t peer_len = sizeof(peer);
        int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                // EMFILE and friends: the pending connection stays queued and
                // is retried on the next wakeup.
                MC_LOG(kWarn, "tcp") << "accept failed: " << std::strerror(errno);
            }
            return;
        }
        std::string who = describeSockaddr(&peer, peer_len);
        Status st = setSocketOptions(fd);
        if (!st.ok()) {
            MC_LOG(kWarn, "tcp") << "dropping connection from " << who << ": " << st.toString();
            ::close(fd);
            continue;
        }
        on_accept_(fd, std::move(who));
    }
}

}  // namespace mooncake::te::tcp
