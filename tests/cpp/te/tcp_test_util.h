// Helpers shared by the TCP transport tests.
#pragma once

#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/cpp/te/transport_test_util.h"

namespace mooncake::te::test {

// A listening socket on 127.0.0.1 at a port the kernel picks, for peers the
// tests write by hand. Returns the fd; *port stays 0 if binding failed.
inline int listenOnLoopback(uint16_t* port) {
    *port = 0;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 && ::listen(fd, 8) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        *port = ntohs(addr.sin_port);
    }
    return fd;
}

// The byte at index `i` of pattern `seed`. Cheap enough to fill and verify
// 256 MiB quickly; `i` enters beyond its low byte so shifted data mismatches.
inline uint8_t patternByte(uint64_t i, uint32_t seed) {
    return static_cast<uint8_t>((i * 131u + seed) ^ (i >> 9) ^ (seed >> 8));
}

inline void fillPattern(uint8_t* p, uint64_t n, uint32_t seed) {
    for (uint64_t i = 0; i < n; ++i)
        p[i] = patternByte(i, seed);
}

// Index of the first byte that differs from the pattern, or -1.
inline int64_t findMismatch(const uint8_t* p, uint64_t n, uint32_t seed) {
    for (uint64_t i = 0; i < n; ++i) {
        if (p[i] != patternByte(i, seed))
            return static_cast<int64_t>(i);
    }
    return -1;
}

// Zero-filled anonymous memory; `shared` survives fork() as the same pages.
class Mapping {
public:
    Mapping(size_t size, bool shared) : size_(size) {
        void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                         (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
        data_ = p == MAP_FAILED ? nullptr : p;
    }
    ~Mapping() {
        if (data_)
            ::munmap(data_, size_);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;

    bool ok() const { return data_ != nullptr; }
    void* data() const { return data_; }
    uint8_t* bytes() const { return static_cast<uint8_t*>(data_); }
    size_t size() const { return size_; }
    uint64_t addr() const { return reinterpret_cast<uint64_t>(data_); }

private:
    void* data_ = nullptr;
    size_t size_;
};

}  // namespace mooncake::te::test
