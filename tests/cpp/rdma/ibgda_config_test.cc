#include <cstdlib>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/ibgda_config.h"

namespace mooncake::te::rdma {
namespace {

TEST(ActiveQpsPerRank, DefaultWhenUnsetOrEmpty) {
    EXPECT_EQ(parseActiveQpsPerRank(nullptr).value(), kDefaultActiveQpsPerRank);
    EXPECT_EQ(parseActiveQpsPerRank("").value(), kDefaultActiveQpsPerRank);
    EXPECT_EQ(kDefaultActiveQpsPerRank, 8);
}

TEST(ActiveQpsPerRank, AcceptsTheRange) {
    EXPECT_EQ(parseActiveQpsPerRank("1").value(), 1);
    EXPECT_EQ(parseActiveQpsPerRank("16").value(), 16);
    EXPECT_EQ(parseActiveQpsPerRank("256").value(), 256);
}

TEST(ActiveQpsPerRank, RejectsWithTheVariableValueAndRange) {
    for (const char* bad :
         {"0", "257", "-1", "+4", " 4", "4 ", "4x", "0x10", "abc", "99999999999999999999"}) {
        auto r = parseActiveQpsPerRank(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(r.status().message(), "MOONCAKE_EP_ACTIVE_QPS_PER_RANK='" + std::string(bad) +
                                            "' is not a QP count; expected an integer in 1..256 "
                                            "(default 8)");
    }
}

TEST(ActiveQpsPerRank, ReadsTheEnvironment) {
    ::setenv("MOONCAKE_EP_ACTIVE_QPS_PER_RANK", "12", 1);
    EXPECT_EQ(activeQpsPerRankFromEnv().value(), 12);
    ::setenv("MOONCAKE_EP_ACTIVE_QPS_PER_RANK", "nope", 1);
    EXPECT_FALSE(activeQpsPerRankFromEnv().ok());
    ::unsetenv("MOONCAKE_EP_ACTIVE_QPS_PER_RANK");
    EXPECT_EQ(activeQpsPerRankFromEnv().value(), 8);
}

}  // namespace
}  // namespace mooncake::te::rdma
