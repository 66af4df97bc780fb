#include "mooncake-transfer-engine/common/random.h"

#include <sys/random.h>

#include <cstdint>
#include <random>
#include <vector>

namespace mooncake {

std::string randomHex(size_t bytes) {
    std::vector<uint8_t> buf(bytes);
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = getrandom(buf.data() + got, bytes - got, 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    if (got < bytes) {  // getrandom unavailable: fall back to random_device.
        std::random_device rd;
        for (size_t i = got; i < bytes; ++i) buf[i] = static_cast<uint8_t>(rd());
    }
    static const char* kHex = "0123456789abcdef";
    std::string out;
    out.reserve(bytes * 2);
    for (uint8_t b : buf) {
        out.push_back(kHex[b >> 4]);
        out.push_back(kHex[b & 15]);
    }
    return out;
}

bool constantTimeEquals(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
    return diff == 0;
}

}  // namespace mooncake
