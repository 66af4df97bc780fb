// MemberAgents and a Coordinator end to end through the wire format, over
// the Cluster's scripted network (control_plane_cluster.h).
#include <gtest/gtest.h>

#include "tests/cpp/pg/control_plane_cluster.h"

namespace mooncake::pg::control_plane::testing {
namespace {

// ---- end to end through the Coordinator ------------------------------------

TEST(ControlPlaneClusterTest, BootstrapJoinFailureAndReplacement) {
    Cluster c(8, 4);
    for (uint32_t r = 0; r < 4; ++r) {
        // init_process_group returns on every founder only once all arrived.
        EXPECT_TRUE(c.done().empty());
        c.start(r, false);
    }
    EXPECT_EQ(c.done().size(), 4u);
    for (uint32_t r = 0; r < 4; ++r) {
        EXPECT_EQ(c.agent(r).selfState(), GMS::kActive);
        EXPECT_EQ(c.agent(r).activeRanks(), (std::vector<int32_t>{1, 1, 1, 1, 0, 0, 0, 0}));
        EXPECT_EQ(c.agent(r).groupSize(), 4);
    }

    // Scale up into reserved slot 4.
    c.start(4, true);
    EXPECT_EQ(c.agent(4).selfState(), GMS::kInactive);
    EXPECT_EQ(c.agent(0).peerState({4}), std::vector<bool>{false});  // not joined yet
    const uint64_t join = c.nextId();
    c.act(4, JoinGroupCmd{c.now(), join, 0ms});
    EXPECT_FALSE(c.result(join).has_value());  // blocks until activated
    EXPECT_EQ(c.agent(0).peerState({4}), std::vector<bool>{true});
    EXPECT_EQ(c.agent(0).numSyncedRanks(), 5);
    const uint64_t act = c.nextId();
    c.act(0, ActivateRanksCmd{c.now(), act, {4}, 0ms});
    ASSERT_TRUE(c.result(act).has_value());
    EXPECT_TRUE(c.result(act)->status.ok());
    ASSERT_TRUE(c.result(join).has_value());
    EXPECT_TRUE(c.result(join)->status.ok());
    for (uint32_t r = 0; r < 5; ++r)
        EXPECT_EQ(c.agent(r).groupSize(), 5) << r;
    // A redundant recover_ranks from another member is harmless.
    const uint64_t again = c.nextId();
    c.act(2, ActivateRanksCmd{c.now(), again, {4}, 0ms});
    EXPECT_TRUE(c.result(again)->status.ok());
    EXPECT_EQ(c.agent(2).epoch(), 2u);

    // Rank 2 dies. Rank 0's collective fails and it syncs.
    c.kill(2);
    c.advanceTo(1000ms);
    const uint64_t sync = c.nextId();
    std::vector<uint8_t> hint(8, 0);
    hint[2] = 1;
    c.act(0, SyncAfterFailureCmd{c.now(), sync, false, hint});
    // Every survivor reports at once and none reaches rank 2, which rank 0's
    // evidence names: the window closes without waiting for its deadline.
    EXPECT_FALSE(c.coord().reconciling());
    EXPECT_EQ(c.now(), 1000ms);
    ASSERT_TRUE(c.result(sync).has_value());
    EXPECT_TRUE(c.result(sync)->status.ok());
    for (uint32_t r : {0u, 1u, 3u, 4u}) {
        EXPECT_EQ(c.agent(r).activeRanks(), (std::vector<int32_t>{1, 1, 0, 1, 1, 0, 0, 0})) << r;
        EXPECT_EQ(c.agent(r).groupSize(), 5);
    }

    // A replacement takes slot 2 with a higher incarnation and is recovered.
    c.start(2, true);
    EXPECT_EQ(c.agent(2).incarnation(), 2u);
    const uint64_t join2 = c.nextId();
    c.act(2, JoinGroupCmd{c.now(), join2, 0ms});
    EXPECT_EQ(c.agent(1).peerState({2}), std::vector<bool>{true});
    const uint64_t rec = c.nextId();
    c.act(1, ActivateRanksCmd{c.now(), rec, {2}, 0ms});
    EXPECT_TRUE(c.result(rec)->status.ok());
    EXPECT_TRUE(c.result(join2)->status.ok());
    for (uint32_t r = 0; r < 5; ++r) {
        EXPECT_EQ(c.agent(r).activeRanks(), (std::vector<int32_t>{1, 1, 1, 1, 1, 0, 0, 0})) << r;
    }
}

TEST(ControlPlaneClusterTest, JoinWithNobodyActivatingFailsWithAClearError) {
    Cluster c(4, 2);
    c.start(0, false);
    c.start(1, false);
    c.start(2, true);
    const uint64_t join = c.nextId();
    c.act(2, JoinGroupCmd{c.now(), join, 5s});
    c.advanceTo(4999ms);
    EXPECT_FALSE(c.result(join).has_value());
    c.advanceTo(5000ms);
    ASSERT_TRUE(c.result(join).has_value());
    EXPECT_EQ(c.result(join)->status.code(), StatusCode::kTimeout);
    EXPECT_NE(c.result(join)->status.message().find("no online member proposed"),
              std::string::npos);
    EXPECT_EQ(c.agent(2).selfState(), GMS::kInactive);
}

TEST(ControlPlaneClusterTest, PartitionedJoinerIsNeverActivated) {
    Cluster c(4, 2);
    c.start(0, false);
    c.start(1, false);
    c.cut(1, 2);
    c.start(2, true);
    c.act(2, JoinGroupCmd{c.now(), c.nextId(), 0ms});
    // Not Healthy: rank 1 cannot reach it.
    EXPECT_EQ(c.agent(0).peerState({2}), std::vector<bool>{false});
    const uint64_t act = c.nextId();
    c.act(0, ActivateRanksCmd{c.now(), act, {2}, 3s});
    c.advanceTo(3000ms);
    ASSERT_TRUE(c.result(act).has_value());
    EXPECT_EQ(c.result(act)->status.code(), StatusCode::kTimeout);
    EXPECT_NE(c.result(act)->status.message().find("expected Healthy"), std::string::npos);
    EXPECT_EQ(c.agent(0).groupSize(), 2);
}

TEST(ControlPlaneClusterTest, FrameworkManagedFailureReportsThenFrameworkDeactivates) {
    Cluster c(4, 3, FailureMode{false, false});
    for (uint32_t r = 0; r < 3; ++r)
        c.start(r, false);
    c.kill(1);
    const uint64_t sync = c.nextId();
    c.act(0, SyncAfterFailureCmd{c.now(), sync, false, {0, 1, 0, 0}});
    c.advanceTo(30000ms);
    EXPECT_TRUE(c.result(sync)->status.ok());
    EXPECT_EQ(c.agent(0).groupSize(), 3);  // unchanged: the framework decides
    EXPECT_EQ(c.agent(0).view().slots[1].rank, RankState::kOffline);
    auto res = effectsOf<ReconciliationResult>(c.coordEffects());
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].unhealthy_active, (std::vector<uint32_t>{1}));
    const uint64_t deact = c.nextId();
    c.act(2, DeactivateRanksCmd{c.now(), deact, {1}});
    EXPECT_TRUE(c.result(deact)->status.ok());
    EXPECT_EQ(c.agent(0).activeRanks(), (std::vector<int32_t>{1, 0, 1, 0}));
    EXPECT_EQ(c.agent(0).groupSize(), 3);
}

TEST(ControlPlaneClusterTest, LeaveShrinksTheGroup) {
    Cluster c(4, 3);
    for (uint32_t r = 0; r < 3; ++r)
        c.start(r, false);
    c.act(2, LeaveCmd{c.now()});
    EXPECT_EQ(c.agent(0).groupSize(), 2);
    EXPECT_EQ(c.agent(0).view().slots[2].member, GMS::kLeft);
}

}  // namespace
}  // namespace mooncake::pg::control_plane::testing
