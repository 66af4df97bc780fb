#include "mooncake-transfer-engine/common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace mooncake {
namespace {

constexpr uint32_t kCastagnoliReversed = 0x82F63B78u;

constexpr std::array<uint32_t, 256> makeTable() {
    std::array<uint32_t, 256> table{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoliReversed : c >> 1;
        table[i] = c;
    }
    return table;
}
constexpr auto kTable = makeTable();

uint32_t crc32cSoftware(uint32_t crc, const uint8_t* p, size_t len) {
    crc = ~crc;
    for (size_t i = 0; i < len; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32cHardware(uint32_t crc, const uint8_t* p,
                                                          size_t len) {
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t word;
        std::memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = static_cast<uint32_t>(c);
    while (len--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}

bool cpuHasSse42() {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return (ecx & bit_SSE4_2) != 0;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t len) {
    const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
    static const bool hw = cpuHasSse42();
    if (hw) return crc32cHardware(crc, p, len);
#endif
    return crc32cSoftware(crc, p, len);
}

}  // namespace mooncake
