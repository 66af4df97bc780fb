#include "benchmarks/te_bench/channel.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <string>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::te::bench {
namespace {

constexpr const char* kSecret = "te_bench";

}  // namespace

bool Control::send(const std::string& line) {
    std::string msg = line + "\n";
    size_t off = 0;
    while (off < msg.size()) {
        ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
        if (n <= 0 && errno != EINTR)
            return false;
        if (n > 0)
            off += static_cast<size_t>(n);
    }
    return true;
}

std::string Control::recv() {
    Deadline deadline = Deadline::afterMs(kControlTimeoutMs);
    while (true) {
        size_t nl = buf_.find('\n');
        if (nl != std::string::npos) {
            std::string line = buf_.substr(0, nl);
            buf_.erase(0, nl + 1);
            return line;
        }
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, deadline.remainingMsForPoll()) <= 0)
            return "";
        char tmp[512];
        ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
        if (n <= 0)
            return "";
        buf_.append(tmp, static_cast<size_t>(n));
    }
}

bool sendAll(int fd, const char* p, uint64_t n) {
    while (n > 0) {
        ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return false;
        }
        p += k;
        n -= static_cast<uint64_t>(k);
    }
    return true;
}

bool recvAll(int fd, char* p, uint64_t n) {
    while (n > 0) {
        ssize_t k = ::recv(fd, p, n, 0);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return false;
        }
        p += k;
        n -= static_cast<uint64_t>(k);
    }
    return true;
}

bool setRawOptions(int fd, const std::string& congestion) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!congestion.empty() && ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion.data(),
                                            static_cast<socklen_t>(congestion.size())) != 0) {
        std::perror(("te_bench: TCP_CONGESTION " + congestion).c_str());
        return false;
    }
    return true;
}

std::string systemCongestion() {
    std::string name;
    if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) {
        char buf[64] = {};
        if (std::fgets(buf, sizeof(buf), f))
            name = buf;
        std::fclose(f);
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
        name.pop_back();
    return name;
}

std::unique_ptr<TransferEngine> makeEngine(const std::string& dir, const std::string& name,
                                           bool force_tcp, Status* st) {
    EngineOptions o;
    o.store = std::make_shared<FileKVStore>(dir);
    o.segment_name = name;
    o.secret = kSecret;
    o.force_tcp = force_tcp;
    auto e = std::make_unique<TransferEngine>(o);
    *st = e->init("127.0.0.1", {});
    return st->ok() ? std::move(e) : nullptr;
}

}  // namespace mooncake::te::bench
