// Membership epochs: they grow past the 16 epoch bits that tokens carry, a
// rank may skip epochs, and a rank still in an older epoch learns of a newer
// one through a status code of its own.
#include <cstdint>
#include <latch>
#include <string>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

using testutil::Cluster;

// all_reduce over `members` (exact int sums) and a multi-round all_gather
// (byte patterns) on rank r.
void expectWorkingCalls(Cluster& cluster, int r, const std::vector<int>& members, uint64_t salt) {
    std::vector<int64_t> v(5, static_cast<int64_t>(salt) * 10 + r);
    Status st = cluster.comm(r).allReduce(v.data(), v.data(), v.size(), DataType::kInt64,
                                          ReduceOp::kSum, testutil::generous());
    ASSERT_TRUE(st.ok()) << "epoch salt " << salt << ": " << st.toString();
    int64_t want = 0;
    for (int m : members)
        want += static_cast<int64_t>(salt) * 10 + m;
    EXPECT_EQ(v, std::vector<int64_t>(5, want));

    const size_t block = 3 * testutil::smallOptions().chunk_bytes + 17;
    std::vector<uint8_t> in(block), out(block * cluster.size(), 0);
    testutil::fillPattern(in.data(), block, salt, r);
    st = cluster.comm(r).allGather(in.data(), out.data(), block, testutil::generous());
    ASSERT_TRUE(st.ok()) << "epoch salt " << salt << ": " << st.toString();
    for (int m : members) {
        EXPECT_EQ(testutil::firstPatternMismatch(out.data() + m * block, block, salt, m), -1)
            << "rank " << r << " salt " << salt << ": block of rank " << m;
    }
}

TEST(CollectivesEpoch, EpochsPastTheTokenBitsKeepWorking) {
    Cluster cluster(3);
    // Steps below 49152 epochs (Communicator::setMembership).
    const std::vector<uint64_t> epochs = {1,      30000,  65534,  65535,  65536, 65537,
                                          100000, 131071, 131072, 131073, 180000};
    cluster.run([&](int r) {
        for (uint64_t e : epochs) {
            ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, e).ok()) << "epoch " << e;
            expectWorkingCalls(cluster, r, {0, 1, 2}, e);
            expectWorkingCalls(cluster, r, {0, 1, 2}, e + 1);
        }
    });
}

// Rank 2 is left out while the others go through 60000 epochs (in steps, as
// views come), applying only some of them itself: flags it wrote into their
// windows in epoch 1 would read as newer than epoch 60002 (modulo 2^16) had
// they not been cleared, and so would theirs in its window.
TEST(CollectivesEpoch, RankBackAfterManyEpochsIgnoresItsOldFlags) {
    Cluster cluster(3);
    // Views are applied after they exist and before the next-but-one does:
    // rank 2 applies 20002 and 40002 once the others worked in 40002, and
    // 60002 comes after that.
    std::latch others_in_40002(2);
    std::latch rank2_in_40002(1);
    // Every rank has its epoch-1 results before the others move on: this test
    // is about old flags after many epochs, not about a peer still copying
    // out a call's last round while the others already run the next epoch
    // (that race is open; see the issue note).
    std::latch epoch1_done(3);
    cluster.run([&](int r) {
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, 1).ok());
        expectWorkingCalls(cluster, r, {0, 1, 2}, 1);
        epoch1_done.arrive_and_wait();
        if (r != 2) {
            for (uint64_t e : {2, 20002, 40002}) {
                ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, e).ok());
                expectWorkingCalls(cluster, r, {0, 1}, e);
            }
            others_in_40002.count_down();
            rank2_in_40002.wait();
        } else {
            others_in_40002.wait();
            ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, 20002).ok());
            ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, 40002).ok());
            rank2_in_40002.count_down();
        }
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, 60002).ok());
        expectWorkingCalls(cluster, r, {0, 1, 2}, 3);
        expectWorkingCalls(cluster, r, {0, 1, 2}, 4);
    });
}

// Rank 1 applies epoch 1 and calls; rank 0, still in epoch 0, must learn
// that by kEpochChanged (not by the text of a message), apply epoch 1 and
// retry; both calls then complete.
TEST(CollectivesEpoch, PeerInANewerEpochIsReportedByItsOwnCode) {
    Cluster cluster(2);
    cluster.run([&](int r) {
        expectWorkingCalls(cluster, r, {0, 1}, 7);
        if (r == 1) {
            ASSERT_TRUE(cluster.comm(1).setMembership({1, 1}, 1).ok());
            expectWorkingCalls(cluster, 1, {0, 1}, 8);
            return;
        }
        std::vector<int64_t> v(5, 80);
        Status st = cluster.comm(0).allReduce(v.data(), v.data(), v.size(), DataType::kInt64,
                                              ReduceOp::kSum, testutil::generous());
        EXPECT_EQ(st.code(), StatusCode::kEpochChanged) << st.toString();
        ASSERT_TRUE(cluster.comm(0).setMembership({1, 1}, 1).ok());
        expectWorkingCalls(cluster, 0, {0, 1}, 8);
    });
}

}  // namespace
}  // namespace mooncake::pg
