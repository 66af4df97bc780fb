// CRC-32C: every implementation the CPU supports against a bit-at-a-time
// reference, over lengths around each implementation's block sizes, unaligned
// starts and chained calls.
#include "mooncake-transfer-engine/common/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace mooncake {
namespace {

uint32_t reference(uint32_t crc, const uint8_t* p, size_t len) {
    crc = ~crc;
    for (size_t i = 0; i < len; ++i) {
        crc ^= p[i];
        for (int b = 0; b < 8; ++b)
            crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
    }
    return ~crc;
}

const Crc32cImpl kAll[] = {Crc32cImpl::kPortable, Crc32cImpl::kSse42, Crc32cImpl::kPclmul,
                           Crc32cImpl::kAvx512};

std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto& b : v)
        b = static_cast<uint8_t>(rng());
    return v;
}

TEST(Crc32cTest, KnownVector) {
    const std::string check = "123456789";
    for (Crc32cImpl impl : kAll) {
        if (crc32cSupported(impl)) {
            EXPECT_EQ(crc32cWith(impl, 0, check.data(), check.size()), 0xE3069283u);
        }
    }
    EXPECT_EQ(crc32c(0, check.data(), check.size()), 0xE3069283u);
}

TEST(Crc32cTest, EveryImplementationMatchesTheReference) {
    const std::vector<uint8_t> data = randomBytes(70000, 1);
    std::mt19937 rng(2);
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= 1100; ++n)
        lengths.push_back(n);
    for (size_t n : {4095, 4096, 4097, 65536, 65536 + 255, 69000})
        lengths.push_back(n);
    for (Crc32cImpl impl : kAll) {
        if (!crc32cSupported(impl))
            continue;
        for (size_t len : lengths) {
            const size_t off = rng() % 64;
            const uint32_t seed = len % 3 == 0 ? 0 : static_cast<uint32_t>(rng());
            ASSERT_EQ(crc32cWith(impl, seed, data.data() + off, len),
                      reference(seed, data.data() + off, len))
                << "impl " << static_cast<int>(impl) << " len " << len << " off " << off;
        }
    }
}

TEST(Crc32cTest, ChainedCallsEqualOneCall) {
    const std::vector<uint8_t> data = randomBytes(1 << 20, 3);
    const uint32_t whole = reference(0, data.data(), data.size());
    for (Crc32cImpl impl : kAll) {
        if (!crc32cSupported(impl))
            continue;
        EXPECT_EQ(crc32cWith(impl, 0, data.data(), data.size()), whole);
        std::mt19937 rng(4);
        uint32_t crc = 0;
        size_t off = 0;
        while (off < data.size()) {
            size_t n = std::min<size_t>(data.size() - off, rng() % 5000);
            crc = crc32cWith(impl, crc, data.data() + off, n);
            off += n;
        }
        EXPECT_EQ(crc, whole) << "impl " << static_cast<int>(impl);
    }
}

}  // namespace
}  // namespace mooncake
