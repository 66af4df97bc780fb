#include "mooncake-transfer-engine/common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mooncake {
namespace {

constexpr uint32_t kCastagnoliReversed = 0x82F63B78u;

constexpr std::array<uint32_t, 256> makeTable() {
    std::array<uint32_t, 256> table{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k)
            c = (c & 1) ? (c >> 1) ^ kCastagnoliReversed : c >> 1;
        table[i] = c;
    }
    return table;
}
constexpr auto kTable = makeTable();

uint32_t crc32cPortable(uint32_t crc, const uint8_t* p, size_t len) {
    crc = ~crc;
    for (size_t i = 0; i < len; ++i)
        crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)

// The payload checksum runs over every byte the tcp transport moves, on both
// ends. One chain of crc32 instructions manages ~8 bytes per 3 cycles, which
// at 1 MiB costs more than the loopback copy itself; folding with carry-less
// multiplies keeps several independent lanes busy instead.
//
// Layout: as in the CRC register, the message is bit-reflected, so in a
// little-endian 64-bit word bit j holds the coefficient of x^(63-j), and the
// first 8 bytes of a 16-byte block are its high-degree half.

// x^n mod P as a reflected register value (bit j = coefficient of x^(31-j)).
// Each step multiplies by x, exactly as the table-driven loop does per bit.
constexpr uint32_t xPowMod(uint32_t n) {
    uint32_t r = 0x80000000u;  // x^0
    for (uint32_t i = 0; i < n; ++i)
        r = (r >> 1) ^ ((r & 1) ? kCastagnoliReversed : 0);
    return r;
}

// Multipliers that carry a 16-byte block A = H*x^64 + L forward by `bits`:
// A*x^bits = H*x^(bits+64) + L*x^bits (mod P). A carry-less multiply of two
// reflected values yields their product times x, hence the -1 in both
// exponents. A 32-bit reflected value sits in the upper half of a 64-bit lane.
struct FoldBy {
    uint64_t high;  // multiplies H (the lower 64-bit lane)
    uint64_t low;   // multiplies L (the upper 64-bit lane)
};
constexpr FoldBy foldBy(uint32_t bits) {
    return {static_cast<uint64_t>(xPowMod(bits + 63)) << 32,
            static_cast<uint64_t>(xPowMod(bits - 1)) << 32};
}
constexpr FoldBy kFold128 = foldBy(128);
constexpr FoldBy kFold256 = foldBy(256);
constexpr FoldBy kFold384 = foldBy(384);
constexpr FoldBy kFold512 = foldBy(512);
constexpr FoldBy kFold2048 = foldBy(2048);

// Runs the CRC register `reg` (no pre/post inversion) over the bytes.
__attribute__((target("sse4.2"))) uint32_t registerSse42(uint32_t reg, const uint8_t* p,
                                                         size_t len) {
    uint64_t c = reg;
    while (len >= 8) {
        uint64_t word;
        std::memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = static_cast<uint32_t>(c);
    while (len--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}

uint32_t crc32cSse42(uint32_t crc, const uint8_t* p, size_t len) {
    return ~registerSse42(~crc, p, len);
}

#define MC_TARGET_PCLMUL __attribute__((target("sse4.2,pclmul")))

MC_TARGET_PCLMUL inline __m128i fold128Constants(FoldBy k) {
    return _mm_set_epi64x(static_cast<int64_t>(k.low), static_cast<int64_t>(k.high));
}

MC_TARGET_PCLMUL inline __m128i fold(__m128i a, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11));
}

MC_TARGET_PCLMUL inline __m128i load128(const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// a0..a3: four consecutive 16-byte blocks (a0 first), already carrying all
// data before them. Returns the register value after them and the rest.
MC_TARGET_PCLMUL uint32_t finish(__m128i a0, __m128i a1, __m128i a2, __m128i a3, const uint8_t* p,
                                 size_t len) {
    __m128i a = _mm_xor_si128(
        _mm_xor_si128(a3, fold(a0, fold128Constants(kFold384))),
        _mm_xor_si128(fold(a1, fold128Constants(kFold256)), fold(a2, fold128Constants(kFold128))));
    const __m128i k128 = fold128Constants(kFold128);
    for (; len >= 16; p += 16, len -= 16)
        a = _mm_xor_si128(fold(a, k128), load128(p));
    // The CRC of the 16 bytes of `a` from a zero register equals a*x^32 mod P,
    // which is the register value of everything folded into it.
    uint64_t reg = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
    reg = _mm_crc32_u64(reg, static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(a, a))));
    return registerSse42(static_cast<uint32_t>(reg), p, len);
}

MC_TARGET_PCLMUL uint32_t crc32cPclmul(uint32_t crc, const uint8_t* p, size_t len) {
    if (len < 64)
        return crc32cSse42(crc, p, len);
    // A starting register r equals r xor-ed into the first 4 bytes of the
    // message with a zero register.
    __m128i a0 = _mm_xor_si128(load128(p), _mm_cvtsi32_si128(static_cast<int>(~crc)));
    __m128i a1 = load128(p + 16), a2 = load128(p + 32), a3 = load128(p + 48);
    p += 64;
    len -= 64;
    const __m128i k512 = fold128Constants(kFold512);
    for (; len >= 64; p += 64, len -= 64) {
        a0 = _mm_xor_si128(fold(a0, k512), load128(p));
        a1 = _mm_xor_si128(fold(a1, k512), load128(p + 16));
        a2 = _mm_xor_si128(fold(a2, k512), load128(p + 32));
        a3 = _mm_xor_si128(fold(a3, k512), load128(p + 48));
    }
    return ~finish(a0, a1, a2, a3, p, len);
}

#define MC_TARGET_AVX512 __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

MC_TARGET_AVX512 inline __m512i fold512Constants(FoldBy k) {
    const auto hi = static_cast<long long>(k.high), lo = static_cast<long long>(k.low);
    return _mm512_set_epi64(lo, hi, lo, hi, lo, hi, lo, hi);
}

// Each 128-bit lane of `a` carried forward, xor `data`.
MC_TARGET_AVX512 inline __m512i fold(__m512i a, __m512i k, __m512i data) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                     _mm512_clmulepi64_epi128(a, k, 0x11), data, 0x96);
}

MC_TARGET_AVX512 inline __m512i load512(const uint8_t* p) {
    return _mm512_loadu_si512(p);
}

MC_TARGET_AVX512 uint32_t crc32cAvx512(uint32_t crc, const uint8_t* p, size_t len) {
    if (len < 256)
        return crc32cPclmul(crc, p, len);
    // Four accumulators of 64 bytes each, 256 bytes apart.
    __m512i x0 = _mm512_xor_si512(
        load512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
    __m512i x1 = load512(p + 64), x2 = load512(p + 128), x3 = load512(p + 192);
    p += 256;
    len -= 256;
    const __m512i k2048 = fold512Constants(kFold2048);
    for (; len >= 256; p += 256, len -= 256) {
        x0 = fold(x0, k2048, load512(p));
        x1 = fold(x1, k2048, load512(p + 64));
        x2 = fold(x2, k2048, load512(p + 128));
        x3 = fold(x3, k2048, load512(p + 192));
    }
    const __m512i k512 = fold512Constants(kFold512);
    x1 = fold(x0, k512, x1);
    x2 = fold(x1, k512, x2);
    x3 = fold(x2, k512, x3);
    for (; len >= 64; p += 64, len -= 64)
        x3 = fold(x3, k512, load512(p));
    // Through memory: GCC 12 warns about the lane-extract intrinsics.
    alignas(64) __m128i lanes[4];
    _mm512_store_si512(lanes, x3);
    // finish() and what the caller runs next may be legacy-SSE code, which
    // runs at about half speed on a Zen 5 while the upper register state is
    // dirty (measured); GCC does not clear it before the call.
    _mm256_zeroupper();
    return ~finish(lanes[0], lanes[1], lanes[2], lanes[3], p, len);
}

#endif  // __x86_64__

using Crc32cFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

Crc32cFn implFn(Crc32cImpl impl) {
    switch (impl) {
#if defined(__x86_64__)
        case Crc32cImpl::kSse42:
            return crc32cSse42;
        case Crc32cImpl::kPclmul:
            return crc32cPclmul;
        case Crc32cImpl::kAvx512:
            return crc32cAvx512;
#endif
        default:
            return crc32cPortable;
    }
}

Crc32cFn bestFn() {
    for (Crc32cImpl impl : {Crc32cImpl::kAvx512, Crc32cImpl::kPclmul, Crc32cImpl::kSse42}) {
        if (crc32cSupported(impl))
            return implFn(impl);
    }
    return crc32cPortable;
}

}  // namespace

bool crc32cSupported(Crc32cImpl impl) {
#if defined(__x86_64__)
    // __builtin_cpu_supports also requires the OS to save the AVX-512 state.
    const bool sse42 = __builtin_cpu_supports("sse4.2");
    const bool pclmul = sse42 && __builtin_cpu_supports("pclmul");
    switch (impl) {
        case Crc32cImpl::kPortable:
            return true;
        case Crc32cImpl::kSse42:
            return sse42;
        case Crc32cImpl::kPclmul:
            return pclmul;
        case Crc32cImpl::kAvx512:
            return pclmul && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("vpclmulqdq");
    }
    return false;
#else
    return impl == Crc32cImpl::kPortable;
#endif
}

uint32_t crc32cWith(Crc32cImpl impl, uint32_t crc, const void* data, size_t len) {
    return implFn(impl)(crc, static_cast<const uint8_t*>(data), len);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t len) {
    static const Crc32cFn fn = bestFn();
    return fn(crc, static_cast<const uint8_t*>(data), len);
}

}  // namespace mooncake
