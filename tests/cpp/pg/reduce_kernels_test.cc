// The 16-bit float conversions and kernel corner cases the collective
// sweeps do not reach (NaN, rounding ties, wrap-around, aliasing).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "mooncake-pg/core/reduce_kernels.h"

namespace mooncake::pg {
namespace {

TEST(HalfConversion, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = halfToFloat(static_cast<uint16_t>(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(f))));
            continue;
        }
        ASSERT_EQ(floatToHalf(f), h) << std::hex << h;
    }
}

TEST(HalfConversion, RoundsToNearestEven) {
    EXPECT_EQ(floatToHalf(1.0f), 0x3C00);
    EXPECT_EQ(floatToHalf(65504.0f), 0x7BFF);
    EXPECT_EQ(floatToHalf(65519.0f), 0x7BFF);
    EXPECT_EQ(floatToHalf(65520.0f), 0x7C00);  // tie, rounds to even = inf
    EXPECT_EQ(floatToHalf(-INFINITY), 0xFC00);
    EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
    EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);            // tie to even (0)
    EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);            // tie to even (2)
    EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);     // tie, stays even
    EXPECT_EQ(floatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3C02);     // tie, up to even
    EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14) * 0.9999f), 0x0400);  // rounds up to normal
}

TEST(Bfloat16Conversion, RoundsToNearestEvenAndKeepsNaN) {
    EXPECT_EQ(floatToBfloat16(1.0f), 0x3F80);
    EXPECT_EQ(bfloat16ToFloat(0x3F80), 1.0f);
    EXPECT_EQ(floatToBfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie, stays even
    EXPECT_EQ(floatToBfloat16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie, up to even
    EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBfloat16(NAN))));
}

TEST(ReduceKernels, NaNPropagatesThroughMinAndMax) {
    const float a[] = {1.0f, NAN, 3.0f};
    const float b[] = {NAN, 2.0f, 1.0f};
    const void* in[] = {a, b};
    float out[3];
    reduceInto(DataType::kFloat32, ReduceOp::kMin, out, in, 2, 3);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(out[2], 1.0f);
    reduceInto(DataType::kFloat32, ReduceOp::kMax, out, in, 2, 3);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(out[2], 3.0f);
}

TEST(ReduceKernels, IntegersWrapAndBoolIsLogical) {
    const int8_t a[] = {127, -128, 16};
    const int8_t b[] = {1, -1, 16};
    const void* in[] = {a, b, a};
    int8_t out[3];
    reduceInto(DataType::kInt8, ReduceOp::kSum, out, in, 3, 3);
    EXPECT_EQ(out[0], static_cast<int8_t>(127 + 1 + 127));
    EXPECT_EQ(out[1], static_cast<int8_t>(-128 - 1 - 128));
    reduceInto(DataType::kInt8, ReduceOp::kProduct, out, in, 3, 3);
    EXPECT_EQ(out[2], 0);  // 16^3 = 4096 wraps to 0

    const uint8_t x[] = {0, 2, 1, 0};
    const uint8_t y[] = {0, 1, 0, 5};
    const void* bin[] = {x, y};
    uint8_t bout[4];
    reduceInto(DataType::kBool, ReduceOp::kSum, bout, bin, 2, 4);
    EXPECT_EQ(std::vector<uint8_t>(bout, bout + 4), (std::vector<uint8_t>{0, 1, 1, 1}));
    reduceInto(DataType::kBool, ReduceOp::kProduct, bout, bin, 2, 4);
    EXPECT_EQ(std::vector<uint8_t>(bout, bout + 4), (std::vector<uint8_t>{0, 1, 0, 0}));
    reduceInto(DataType::kBool, ReduceOp::kBxor, bout, bin, 2, 4);
    EXPECT_EQ(std::vector<uint8_t>(bout, bout + 4), (std::vector<uint8_t>{0, 0, 1, 1}));
}

TEST(ReduceKernels, OutputMayAliasAnyInput) {
    constexpr size_t kCount = 1500;  // spans several tiles
    for (int alias = 0; alias < 4; ++alias) {
        std::vector<std::vector<double>> inputs(4, std::vector<double>(kCount));
        for (int k = 0; k < 4; ++k) {
            for (size_t i = 0; i < kCount; ++i)
                inputs[k][i] = static_cast<double>(k * 1000 + i);
        }
        const void* in[] = {inputs[0].data(), inputs[1].data(), inputs[2].data(), inputs[3].data()};
        reduceInto(DataType::kFloat64, ReduceOp::kAvg, inputs[alias].data(), in, 4, kCount);
        for (size_t i = 0; i < kCount; ++i) {
            ASSERT_EQ(inputs[alias][i], (6000.0 + 4.0 * i) / 4) << alias << " " << i;
        }
    }
}

TEST(ReduceKernels, HalfRoundsAfterEveryStep) {
    // 2048 + 1 + 1 in float16: each step rounds 2049 back to 2048.
    const uint16_t a[] = {floatToHalf(2048.0f)};
    const uint16_t one[] = {floatToHalf(1.0f)};
    const void* in[] = {a, one, one};
    uint16_t out[1];
    reduceInto(DataType::kFloat16, ReduceOp::kSum, out, in, 3, 1);
    EXPECT_EQ(halfToFloat(out[0]), 2048.0f);
}

}  // namespace
}  // namespace mooncake::pg
