// The control-plane hosts end to end when members fail: reconciliation of a
// vanished or stalled member, the framework-managed mode, late evidence, and
// a replacement rejoining a dead slot. Helpers in control_plane_host_util.h;
// every wait is on a condition with a deadline.
#include <gtest/gtest.h>

#include "tests/cpp/pg/control_plane_host_util.h"

namespace mooncake::pg::control_plane {
namespace {

using namespace host_test;  // NOLINT(build/namespaces): the tests' helpers

TEST(ControlPlaneHostTest, VanishedMemberIsDeactivatedByReconciliation) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    g.host(3).stop();  // no Leave: to the group it just stops answering
    // The survivors' data plane failed without naming anyone: only the
    // probes (which rank 3 no longer answers) can find the culprit.
    auto results = onThreads(
        {0, 1, 2}, [&](uint32_t r) { return g.host(r).syncAfterFailure(false, {}, in(20s)); });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    for (uint32_t r = 0; r < 3; ++r) {
        // Returned with the reconciliation's view already applied.
        EXPECT_EQ(g.host(r).activeRanks(), maskOf(4, {0, 1, 2})) << "rank " << r;
        EXPECT_EQ(g.host(r).view().slots[3].rank, RankState::kOffline);
    }
    g.expectAllSee({0, 1, 2}, maskOf(4, {0, 1, 2}));
}

TEST(ControlPlaneHostTest, StalledMemberNamedInHintsIsExcluded) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    // Rank 3's host thread is alive and answers probes, but its data plane
    // stalled: every survivor's collective names it.
    auto results = onThreads({0, 1, 2}, [&](uint32_t r) {
        return g.host(r).syncAfterFailure(false, hint(4, {3}), in(20s));
    });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2}));
    EXPECT_EQ(g.host(3).view().slots[3].member, GMS::kInactive);
    for (uint32_t r = 0; r < 3; ++r)
        EXPECT_EQ(g.host(0).view().slots[r].rank, RankState::kHealthy);
    // The suspicion ended with the epoch: rank 3 can be recovered in place.
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 2));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
}

TEST(ControlPlaneHostTest, FrameworkManagedModeOnlyReports) {
    HostGroup g(4, 4, FailureMode{false, false});
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    // Deferred evidence first, then the sync without a hint: the note counts.
    for (uint32_t r = 0; r < 3; ++r)
        g.host(r).noteEvidence(hint(4, {3}));
    auto results = onThreads(
        {0, 1, 2}, [&](uint32_t r) { return g.host(r).syncAfterFailure(false, {}, in(10s)); });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    for (uint32_t r = 0; r < 4; ++r) {
        // Reported, not acted upon: rank 3 is still Active, but Offline. The
        // reconciliation still ends in a fresh epoch (a data-plane restart).
        Status resynced =
            g.host(r).awaitView([](const GroupView& v) { return v.epoch == 2; }, in(5s));
        EXPECT_TRUE(resynced.ok()) << "rank " << r << ": " << resynced.toString();
        EXPECT_EQ(g.host(r).activeRanks(), maskOf(4, {0, 1, 2, 3})) << "rank " << r;
    }
    Status offline = g.host(0).awaitView(
        [](const GroupView& v) { return v.slots[3].rank == RankState::kOffline; }, in(2s));
    EXPECT_TRUE(offline.ok()) << offline.toString();
    // The framework decides.
    Status st = g.host(0).deactivateRanks({3}, in(5s));
    ASSERT_TRUE(st.ok()) << st.toString();
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2}));
}

TEST(ControlPlaneHostTest, LateReportOfAFailureAlreadyReconciledOpensNoOtherReconciliation) {
    HostGroup g(4, 4, FailureMode{false, false});
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    const uint64_t failed_in = g.host(0).view().epoch;
    for (uint32_t r = 0; r < 3; ++r)
        g.host(r).noteEvidence(hint(4, {3}));
    // Ranks 1 and 2 report. Rank 0 only answers the probe round, which is
    // all the window needs from it, so it closes with a fresh epoch.
    auto results = onThreads(
        {1, 2}, [&](uint32_t r) { return g.host(r).syncAfterFailure(false, {}, in(10s)); });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i + 1 << ": " << results[i].toString();
    Status resynced =
        g.host(0).awaitView([&](const GroupView& v) { return v.epoch == failed_in + 1; }, in(5s));
    ASSERT_TRUE(resynced.ok()) << resynced.toString();
    // Rank 0 reports the same failure only now (its worker was late): the
    // evidence is of the epoch the reconciliation already ended.
    Status late = g.host(0).syncAfterFailure(false, {}, in(10s));
    EXPECT_TRUE(late.ok()) << late.toString();
    EXPECT_EQ(g.host(0).view().epoch, failed_in + 1)
        << "the late report opened another reconciliation and restarted the data plane again";
    EXPECT_EQ(g.coord().view().epoch, failed_in + 1);
}

TEST(ControlPlaneHostTest, LateEvidenceAgainstADeactivatedRankDoesNotBlockItsRecovery) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    const uint64_t failed_in = g.host(2).view().epoch;
    // Ranks 0 and 1 name the stalled rank 3; the window closes on rank 2's
    // probe answers alone and deactivates it.
    auto results = onThreads({0, 1}, [&](uint32_t r) {
        return g.host(r).syncAfterFailure(false, hint(4, {3}), in(10s));
    });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    Status dropped = g.host(2).awaitView(
        [&](const GroupView& v) { return v.epoch > failed_in && !v.isActive(3); }, in(5s));
    ASSERT_TRUE(dropped.ok()) << dropped.toString();
    // Rank 2's worker reports the same failure only now, naming rank 3.
    Status late = g.host(2).syncAfterFailure(false, hint(4, {3}), in(10s));
    EXPECT_TRUE(late.ok()) << late.toString();
    // Rank 3 (alive all along) is recovered in place, with rank 2 proposing:
    // rank 2 must not go on reporting it unreachable.
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 2));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
}

TEST(ControlPlaneHostTest, ReplacementRejoinsDeadSlotWithHigherIncarnation) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    g.host(3).stop();
    // The launcher starts a replacement at once. Its first registration is
    // refused (the slot is still Active) and opens a window; once the window
    // deactivates the silent old process, the retry is accepted.
    ASSERT_NO_FATAL_FAILURE(g.addExtension(3));
    EXPECT_EQ(g.host(3).incarnation(), 2u);
    g.expectAllSee({0, 1, 2}, maskOf(4, {0, 1, 2}));
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 1));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
    EXPECT_EQ(g.host(0).view().slots[3].incarnation, 2u);
    EXPECT_EQ(g.coord().view().slots[3].incarnation, 2u);
}

}  // namespace
}  // namespace mooncake::pg::control_plane
