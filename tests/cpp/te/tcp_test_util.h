// Helpers shared by the TCP transport tests.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/cpp/te/transport_test_util.h"

namespace mooncake::te::test {

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
