// Reads a fuzz input as a stream of decisions. Past the end every read
// returns zeros, so any prefix of an input is itself a valid (shorter) run and
// libFuzzer's truncations stay meaningful.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake::fuzz {

class FuzzInput {
public:
    FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    bool done() const { return pos_ >= size_; }

    uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
    uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
    uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
    uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }
    bool flag() { return (u8() & 1) != 0; }
    // Uniform enough in [0, n); 0 when n is 0.
    uint32_t below(uint32_t n) {
        if (n == 0)
            return 0;
        return n <= 256 ? u8() % n : u32() % n;
    }
    // Up to `max` raw bytes, the count read first.
    std::string bytes(size_t max) {
        size_t n = max == 0 ? 0 : u16() % (max + 1);
        std::string s;
        while (n-- > 0 && !done())
            s.push_back(static_cast<char>(u8()));
        return s;
    }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

}  // namespace mooncake::fuzz
