// The reference checks themselves. The collective suites are only as strong
// as checkReduction: these construct wrong results a plausible bug would
// produce (a member's term dropped, an element off by one unit in the last
// place) and require the check to reject them, and exact results to pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

using testutil::checkReduction;
using testutil::floatValue;
using testutil::inputBits;

constexpr uint64_t kSeed = 11;
const std::vector<int> kMembers = {0, 1, 2, 3};

// Bits of `v` in a float dtype; every value used here is exact in it.
uint64_t encode(DataType t, double v) {
    switch (t) {
        case DataType::kFloat16:
            return testutil::exactHalfBits(v);
        case DataType::kBFloat16:
            return testutil::exactBf16Bits(v);
        default: {
            const float f = static_cast<float>(v);
            uint32_t b;
            std::memcpy(&b, &f, 4);
            return b;
        }
    }
}

double exactSum(DataType t, size_t i, const std::vector<int>& members) {
    double s = 0;
    for (int m : members)
        s += floatValue(t, inputBits(t, ReduceOp::kSum, kSeed, m, i));
    return s;
}

// An element whose sum has |sum| >= 6.25 while member 3's term is +-0.25: the
// case a 4e-2 relative tolerance let through in bf16.
size_t elementWithSmallTerm(DataType t) {
    for (size_t i = 0; i < 100000; ++i) {
        const double term = floatValue(t, inputBits(t, ReduceOp::kSum, kSeed, 3, i));
        if (std::fabs(term) == 0.25 && std::fabs(exactSum(t, i, kMembers)) >= 6.25)
            return i;
    }
    ADD_FAILURE() << "no element with a 0.25 term and |sum| >= 6.25 in the first 100000";
    return 0;
}

class CheckReductionTest : public ::testing::TestWithParam<DataType> {};

TEST_P(CheckReductionTest, RejectsASumWithADroppedQuarter) {
    const DataType t = GetParam();
    const size_t i = elementWithSmallTerm(t);
    const double term = floatValue(t, inputBits(t, ReduceOp::kSum, kSeed, 3, i));
    const double wrong = exactSum(t, i, kMembers) - term;
    const uint64_t bits = encode(t, wrong);
    std::vector<uint8_t> got(dataTypeSize(t));
    testutil::writeElement(got.data(), got.size(), bits);
    EXPECT_NE(checkReduction(t, ReduceOp::kSum, kMembers, kSeed, i, got.data(), 1), "")
        << "sum " << exactSum(t, i, kMembers) << " reported as " << wrong;
}

TEST_P(CheckReductionTest, AcceptsExactSumsMinMaxAndRejectsOneUlpOff) {
    const DataType t = GetParam();
    const size_t es = dataTypeSize(t);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
        for (size_t i = 0; i < 64; ++i) {
            double want = floatValue(t, inputBits(t, op, kSeed, 0, i));
            for (size_t m = 1; m < kMembers.size(); ++m) {
                const double v = floatValue(t, inputBits(t, op, kSeed, kMembers[m], i));
                want = op == ReduceOp::kSum
                           ? want + v
                           : (op == ReduceOp::kMin ? std::min(want, v) : std::max(want, v));
            }
            std::vector<uint8_t> got(es);
            const uint64_t bits = encode(t, want);
            testutil::writeElement(got.data(), es, bits);
            EXPECT_EQ(checkReduction(t, op, kMembers, kSeed, i, got.data(), 1), "");
            if (want == 0)
                continue;
            // The neighbouring value of the dtype (bits + 1 moves away from
            // zero by one unit in the last place).
            testutil::writeElement(got.data(), es, bits + 1);
            EXPECT_NE(checkReduction(t, op, kMembers, kSeed, i, got.data(), 1), "")
                << "op " << static_cast<int>(op) << " element " << i;
        }
    }
}

// The product agrees with the documented table, cell by cell, and explains
// each rejection naming the op and the dtype.
TEST(SupportTable, MatchesReduceOpSupported) {
    size_t cells = 0;
    int index = 0;
    for (const auto& row : testutil::kSupportTable) {
        EXPECT_EQ(static_cast<int>(row.dtype), index++) << "rows in DataType order";
        for (int o = 0; o < testutil::kNumReduceOps; ++o) {
            const auto op = static_cast<ReduceOp>(o);
            std::string why;
            const bool want = row.ops[o] != '-';
            EXPECT_EQ(reduceOpSupported(op, row.dtype, &why), want)
                << reduceOpName(op) << " on " << dataTypeName(row.dtype);
            if (!want) {
                EXPECT_NE(why.find(reduceOpName(op)), std::string::npos) << why;
                EXPECT_NE(why.find(dataTypeName(row.dtype)), std::string::npos) << why;
            }
            ++cells;
        }
    }
    // Every dtype and every op of the enums has a cell.
    EXPECT_EQ(cells, 10u * 8u);
    EXPECT_EQ(static_cast<int>(ReduceOp::kBxor) + 1, testutil::kNumReduceOps);
    EXPECT_EQ(static_cast<size_t>(DataType::kBool) + 1, std::size(testutil::kSupportTable));
}

INSTANTIATE_TEST_SUITE_P(Floats, CheckReductionTest,
                         ::testing::Values(DataType::kFloat16, DataType::kBFloat16,
                                           DataType::kFloat32),
                         [](const auto& info) { return std::string(dataTypeName(info.param)); });

}  // namespace
}  // namespace mooncake::pg
