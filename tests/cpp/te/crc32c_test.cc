// CRC-32C: every implementation against a bit-at-a-time reference, over
// lengths around each implementation's block sizes, unaligned starts and
// chained calls. One test instance per implementation, so an implementation
// the CPU lacks shows up as a skipped test with the reason, not as a pass.
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

const char* implName(Crc32cImpl impl) {
    switch (impl) {
        case Crc32cImpl::kPortable:
            return "Portable";
        case Crc32cImpl::kSse42:
            return "Sse42";
        case Crc32cImpl::kPclmul:
            return "Pclmul";
        case Crc32cImpl::kAvx512:
            return "Avx512";
    }
    return "Unknown";
}

const char* implNeeds(Crc32cImpl impl) {
    switch (impl) {
        case Crc32cImpl::kPortable:
            return "nothing";
        case Crc32cImpl::kSse42:
            return "SSE4.2";
        case Crc32cImpl::kPclmul:
            return "SSE4.2 and PCLMULQDQ";
        case Crc32cImpl::kAvx512:
            return "AVX-512 and VPCLMULQDQ";
    }
    return "?";
}

class Crc32cImplTest : public ::testing::TestWithParam<Crc32cImpl> {
protected:
    void SetUp() override {
        if (!crc32cSupported(GetParam())) {
            GTEST_SKIP() << "crc32c implementation " << implName(GetParam())
                         << " is not tested: this CPU lacks " << implNeeds(GetParam());
        }
    }
};

TEST(Crc32cTest, DefaultMatchesKnownVector) {
    const std::string check = "123456789";
    EXPECT_EQ(crc32c(0, check.data(), check.size()), 0xE3069283u);
}

TEST_P(Crc32cImplTest, KnownVector) {
    const std::string check = "123456789";
    EXPECT_EQ(crc32cWith(GetParam(), 0, check.data(), check.size()), 0xE3069283u);
}

TEST_P(Crc32cImplTest, MatchesTheReference) {
    const std::vector<uint8_t> data = randomBytes(70000, 1);
    std::mt19937 rng(2);
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= 1100; ++n)
        lengths.push_back(n);
    for (size_t n : {4095, 4096, 4097, 65536, 65536 + 255, 69000})
        lengths.push_back(n);
    for (size_t len : lengths) {
        const size_t off = rng() % 64;
        const uint32_t seed = len % 3 == 0 ? 0 : static_cast<uint32_t>(rng());
        ASSERT_EQ(crc32cWith(GetParam(), seed, data.data() + off, len),
                  reference(seed, data.data() + off, len))
            << "len " << len << " off " << off;
    }
}

TEST_P(Crc32cImplTest, ChainedCallsEqualOneCall) {
    const std::vector<uint8_t> data = randomBytes(1 << 20, 3);
    const uint32_t whole = reference(0, data.data(), data.size());
    EXPECT_EQ(crc32cWith(GetParam(), 0, data.data(), data.size()), whole);
    std::mt19937 rng(4);
    uint32_t crc = 0;
    size_t off = 0;
    while (off < data.size()) {
        size_t n = std::min<size_t>(data.size() - off, rng() % 5000);
        crc = crc32cWith(GetParam(), crc, data.data() + off, n);
        off += n;
    }
    EXPECT_EQ(crc, whole);
}

INSTANTIATE_TEST_SUITE_P(AllImpls, Crc32cImplTest, ::testing::ValuesIn(kAll),
                         [](const ::testing::TestParamInfo<Crc32cImpl>& info) {
                             return std::string(implName(info.param));
                         });

}  // namespace
}  // namespace mooncake
