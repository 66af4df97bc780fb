#include "mooncake-pg/core/reduce_kernels.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

namespace mooncake::pg {
namespace {

// The conversions are inline here so the reduction loops can keep them in
// registers; the exported functions below wrap them.
inline float halfBitsToFloat(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t magnitude = h & 0x7FFFu;
    if (magnitude >= 0x7C00u) {  // inf or NaN: keep the payload bits
        return std::bit_cast<float>(sign | 0x7F800000u | ((magnitude & 0x3FFu) << 13));
    }
    if (magnitude < 0x0400u) {  // zero or subnormal: an integer count of 2^-24
        const float v = static_cast<float>(magnitude) * 0x1p-24f;
        return sign != 0 ? -v : v;
    }
    // Normal: rebias the exponent from 15 to 127.
    return std::bit_cast<float>(sign | ((magnitude << 13) + 0x38000000u));
}

inline uint16_t floatToHalfBits(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {  // inf stays inf; NaN stays a quiet NaN
        return sign | 0x7C00u | (ax > 0x7F800000u ? 0x0200u | ((ax >> 13) & 0x3FFu) : 0u);
    }
    if (ax >= 0x477FF000u)
        return sign | 0x7C00u;  // >= 65520 rounds to inf
    if (ax < 0x38800000u) {
        // Below the smallest normal half: adding 0.5 puts the float's last
        // mantissa bit at 2^-24 (the half subnormal step), so the FPU does the
        // round-to-nearest-even for us.
        const float shifted = std::bit_cast<float>(ax) + 0.5f;
        return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(shifted) - 0x3F000000u);
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
    // to nearest even; a carry out of the mantissa correctly bumps the exponent.
    const uint32_t odd = (ax >> 13) & 1u;
    return sign | static_cast<uint16_t>((ax - 0x38000000u + 0x0FFFu + odd) >> 13);
}

inline float bf16BitsToFloat(uint16_t b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t floatToBf16Bits(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return static_cast<uint16_t>((x >> 16) | 0x0040u);
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// Storage/accumulator traits: how an element is loaded into the type the
// operators work on, stored back, and rounded after each step.
template <typename T>
struct Native {
    using Storage = T;
    using Acc = T;
    static Acc load(T v) { return v; }
    static T store(Acc v) { return v; }
    static Acc round(Acc v) { return v; }
};

struct Half {
    using Storage = uint16_t;
    using Acc = float;
    static Acc load(uint16_t v) { return halfBitsToFloat(v); }
    static uint16_t store(Acc v) { return floatToHalfBits(v); }
    static Acc round(Acc v) { return halfBitsToFloat(floatToHalfBits(v)); }
};

struct BFloat16 {
    using Storage = uint16_t;
    using Acc = float;
    static Acc load(uint16_t v) { return bf16BitsToFloat(v); }
    static uint16_t store(Acc v) { return floatToBf16Bits(v); }
    static Acc round(Acc v) { return bf16BitsToFloat(floatToBf16Bits(v)); }
};

// Integer arithmetic goes through an unsigned type at least as wide as int,
// so overflow wraps instead of being undefined (and narrow types are not
// promoted to a signed int that could overflow in a product).
template <typename A>
using WrapType =
    std::conditional_t<(sizeof(A) < sizeof(unsigned)), unsigned, std::make_unsigned_t<A>>;

struct SumOp {
    template <typename A>
    static A apply(A a, A b) {
        if constexpr (std::is_integral_v<A>) {
            return static_cast<A>(static_cast<WrapType<A>>(a) + static_cast<WrapType<A>>(b));
        } else {
            return a + b;
        }
    }
};

struct ProductOp {
    template <typename A>
    static A apply(A a, A b) {
        if constexpr (std::is_integral_v<A>) {
            return static_cast<A>(static_cast<WrapType<A>>(a) * static_cast<WrapType<A>>(b));
        } else {
            return a * b;
        }
    }
};

struct MinOp {
    template <typename A>
    static A apply(A a, A b) {
        // `a != a` is the NaN test; it folds away for integers.
        return (a < b || a != a) ? a : b;
    }
};

struct MaxOp {
    template <typename A>
    static A apply(A a, A b) {
        return (b < a || a != a) ? a : b;
    }
};

struct BandOp {
    template <typename A>
    static A apply(A a, A b) {
        return static_cast<A>(a & b);
    }
};
struct BorOp {
    template <typename A>
    static A apply(A a, A b) {
        return static_cast<A>(a | b);
    }
};
struct BxorOp {
    template <typename A>
    static A apply(A a, A b) {
        return static_cast<A>(a ^ b);
    }
};

// bool elements are bytes; any non-zero byte is true.
struct LogicalOr {
    static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};
struct LogicalAnd {
    static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};
struct LogicalXor {
    static uint8_t apply(uint8_t a, uint8_t b) {
        return static_cast<uint8_t>((a != 0) != (b != 0));
    }
};

// Elements per tile: the accumulator tile stays in L1 while every input
// streams through it once.
constexpr size_t kTile = 512;

// One tile. Full tiles have a compile-time trip count and write through a
// local accumulator that cannot alias anything, which is what GCC's -O2
// ("very cheap") vectorizer needs; the short tail runs the same code with a
// runtime count. Reading every input of the tile before writing `dst` makes
// exact aliasing of the output with an input safe.
template <class Tr, class Op, bool kFull>
inline void reduceTile(typename Tr::Storage* dst, const void* const* in, int n, size_t base,
                       size_t m, bool average) {
    using S = typename Tr::Storage;
    using A = typename Tr::Acc;
    const size_t len = kFull ? kTile : m;
    A acc[kTile];
    const S* a = static_cast<const S*>(in[0]) + base;
    const S* b = static_cast<const S*>(in[1]) + base;
    for (size_t i = 0; i < len; ++i)
        acc[i] = Tr::round(Op::apply(Tr::load(a[i]), Tr::load(b[i])));
    for (int k = 2; k < n; ++k) {
        const S* x = static_cast<const S*>(in[k]) + base;
        for (size_t i = 0; i < len; ++i)
            acc[i] = Tr::round(Op::apply(acc[i], Tr::load(x[i])));
    }
    if constexpr (std::is_floating_point_v<A>) {
        if (average) {
            const A divisor = static_cast<A>(n);
            for (size_t i = 0; i < len; ++i)
                acc[i] = acc[i] / divisor;
        }
    }
    for (size_t i = 0; i < len; ++i)
        dst[i] = Tr::store(acc[i]);
}

template <class Tr, class Op>
void reduceTyped(void* out, const void* const* in, int n, size_t count, bool average) {
    using S = typename Tr::Storage;
    S* o = static_cast<S*>(out);
    if (n == 1) {
        // Dividing by one changes nothing, so AVG of one input is a copy too.
        if (out != in[0])
            std::memmove(out, in[0], count * sizeof(S));
        return;
    }
    size_t base = 0;
    for (; base + kTile <= count; base += kTile) {
        reduceTile<Tr, Op, true>(o + base, in, n, base, kTile, average);
    }
    if (base < count)
        reduceTile<Tr, Op, false>(o + base, in, n, base, count - base, average);
}

template <class Tr>
void reduceArithmetic(ReduceOp op, void* out, const void* const* in, int n, size_t count) {
    using A = typename Tr::Acc;
    switch (op) {
        case ReduceOp::kSum:
            return reduceTyped<Tr, SumOp>(out, in, n, count, false);
        case ReduceOp::kAvg:
            return reduceTyped<Tr, SumOp>(out, in, n, count, true);
        case ReduceOp::kProduct:
            return reduceTyped<Tr, ProductOp>(out, in, n, count, false);
        case ReduceOp::kMin:
            return reduceTyped<Tr, MinOp>(out, in, n, count, false);
        case ReduceOp::kMax:
            return reduceTyped<Tr, MaxOp>(out, in, n, count, false);
        case ReduceOp::kBand:
        case ReduceOp::kBor:
        case ReduceOp::kBxor:
            if constexpr (std::is_integral_v<A>) {
                if (op == ReduceOp::kBand)
                    return reduceTyped<Tr, BandOp>(out, in, n, count, false);
                if (op == ReduceOp::kBor)
                    return reduceTyped<Tr, BorOp>(out, in, n, count, false);
                return reduceTyped<Tr, BxorOp>(out, in, n, count, false);
            }
            return;  // rejected by reduceOpSupported
    }
}

void reduceBool(ReduceOp op, void* out, const void* const* in, int n, size_t count) {
    using Tr = Native<uint8_t>;
    switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMax:
        case ReduceOp::kBor:
            return reduceTyped<Tr, LogicalOr>(out, in, n, count, false);
        case ReduceOp::kProduct:
        case ReduceOp::kMin:
        case ReduceOp::kBand:
            return reduceTyped<Tr, LogicalAnd>(out, in, n, count, false);
        case ReduceOp::kBxor:
            return reduceTyped<Tr, LogicalXor>(out, in, n, count, false);
        case ReduceOp::kAvg:
            return;  // rejected by reduceOpSupported
    }
}

}  // namespace

void reduceInto(DataType dtype, ReduceOp op, void* out, const void* const* in, int n,
                size_t count) {
    if (count == 0 || n < 1)
        return;
    switch (dtype) {
        case DataType::kFloat32:
            return reduceArithmetic<Native<float>>(op, out, in, n, count);
        case DataType::kFloat64:
            return reduceArithmetic<Native<double>>(op, out, in, n, count);
        case DataType::kFloat16:
            return reduceArithmetic<Half>(op, out, in, n, count);
        case DataType::kBFloat16:
            return reduceArithmetic<BFloat16>(op, out, in, n, count);
        case DataType::kInt8:
            return reduceArithmetic<Native<int8_t>>(op, out, in, n, count);
        case DataType::kUInt8:
            return reduceArithmetic<Native<uint8_t>>(op, out, in, n, count);
        case DataType::kInt16:
            return reduceArithmetic<Native<int16_t>>(op, out, in, n, count);
        case DataType::kInt32:
            return reduceArithmetic<Native<int32_t>>(op, out, in, n, count);
        case DataType::kInt64:
            return reduceArithmetic<Native<int64_t>>(op, out, in, n, count);
        case DataType::kBool:
            return reduceBool(op, out, in, n, count);
    }
}

float halfToFloat(uint16_t h) {
    return halfBitsToFloat(h);
}
uint16_t floatToHalf(float f) {
    return floatToHalfBits(f);
}
float bfloat16ToFloat(uint16_t b) {
    return bf16BitsToFloat(b);
}
uint16_t floatToBfloat16(float f) {
    return floatToBf16Bits(f);
}

}  // namespace mooncake::pg
