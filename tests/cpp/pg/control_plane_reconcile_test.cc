// Coordinator: failure evidence, incarnations, reconciliation windows, the
// healthy-set rule and message admission, driven without sockets or threads.
#include <gtest/gtest.h>

#include "mooncake-pg/control_plane/coordinator.h"
#include "mooncake-pg/control_plane/healthy_set.h"
#include "tests/cpp/pg/control_plane_test_util.h"

namespace mooncake::pg::control_plane::testing {
namespace {

using GMS = GroupMemberState;

// ---- evidence, incarnations and reconciliation ---------------------------

TEST(CoordinatorTest, ReconciliationWindowOpensAndClosesOnTickAtTheRightTime) {
    auto d = bootstrapped();
    d.tickAt(1000ms);
    auto fx = d.evidence(0, {2});
    ASSERT_TRUE(d.coord().reconciling());
    auto starts = sentTo<ReconcileStart>(fx, 3);
    ASSERT_EQ(starts.size(), 1u);
    EXPECT_EQ(starts[0].reconcile_id, 1u);
    EXPECT_EQ(starts[0].window_ms, 30000u);
    auto acks = sentTo<EvidenceAck>(fx, 0);
    ASSERT_EQ(acks.size(), 1u);
    EXPECT_EQ(acks[0].request_id, 77u);
    EXPECT_EQ(acks[0].reconcile_id, 1u);
    EXPECT_EQ(acks[0].window_remaining_ms, 30000u);
    EXPECT_EQ(d.coord().nextDeadline(), Millis(31000));

    // More evidence joins the same window.
    d.tickAt(2000ms);
    fx = d.evidence(1, {2});
    EXPECT_EQ(sentTo<EvidenceAck>(fx, 1).at(0).reconcile_id, 1u);
    EXPECT_EQ(sentTo<EvidenceAck>(fx, 1).at(0).window_remaining_ms, 29000u);
    EXPECT_TRUE(sentTo<ReconcileStart>(fx, 1).empty());

    // Ranks 0, 1, 3 report; rank 2 is silent, but rank 3 still reaches it:
    // it may be alive and stuck in a collective, so the window waits for it.
    d.reportLinks(0, {0, 1, 3});
    d.reportLinks(1, {0, 1, 3});
    d.reportLinks(3, {0, 1, 2, 3});
    fx = d.tickAt(30999ms);
    EXPECT_TRUE(d.coord().reconciling());
    EXPECT_TRUE(effectsOf<ReconciliationResult>(fx).empty());

    fx = d.tickAt(31000ms);
    EXPECT_FALSE(d.coord().reconciling());
    auto res = effectsOf<ReconciliationResult>(fx);
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].healthy, (std::vector<uint32_t>{0, 1, 3}));
    EXPECT_EQ(res[0].unhealthy_active, (std::vector<uint32_t>{2}));
    EXPECT_TRUE(res[0].deactivated);
    EXPECT_TRUE(res[0].exact);
    auto commits = effectsOf<ViewCommitted>(fx);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].deactivated, (std::vector<uint32_t>{2}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 0, 1, 0, 0, 0, 0}));
    EXPECT_EQ(d.view().slots[2].rank, RankState::kOffline);
    EXPECT_EQ(d.view().slots[0].rank, RankState::kHealthy);
    auto msgs = sentTo<ReconcileResult>(fx, 0);
    ASSERT_EQ(msgs.size(), 1u);
    EXPECT_EQ(msgs[0].healthy, (std::vector<uint8_t>{1, 1, 0, 1, 0, 0, 0, 0}));
    EXPECT_TRUE(msgs[0].deactivated);
}

// A SIGKILLed rank: every survivor's data plane names it and no report
// reaches it, so the window closes on the last survivor's report instead of
// at its deadline.
TEST(CoordinatorTest, WindowClosesOnceEveryoneButTheBlamedDeadReported) {
    auto d = bootstrapped();
    d.tickAt(1000ms);
    d.evidence(0, {2});
    d.evidence(1, {2});
    ASSERT_TRUE(d.coord().reconciling());
    d.reportLinks(0, {0, 1, 3});
    d.reportLinks(1, {0, 1, 3});
    EXPECT_TRUE(d.coord().reconciling()) << "rank 3 has not reported yet";
    auto fx = d.reportLinks(3, {0, 1, 3});
    EXPECT_FALSE(d.coord().reconciling());
    auto res = effectsOf<ReconciliationResult>(fx);
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].healthy, (std::vector<uint32_t>{0, 1, 3}));
    EXPECT_EQ(res[0].unhealthy_active, (std::vector<uint32_t>{2}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 0, 1, 0, 0, 0, 0}));
    EXPECT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
}

// Blame alone is not death: a blamed rank that some report still reaches,
// or that speaks up itself, is waited for (a partition blames both sides).
TEST(CoordinatorTest, WindowWaitsForABlamedRankThatIsReachedOrSpeaks) {
    auto d = bootstrapped(4, 4);
    d.evidence(0, {2, 3});
    d.reportLinks(0, {0, 1});
    d.reportLinks(1, {0, 1, 3});
    EXPECT_TRUE(d.coord().reconciling()) << "rank 1 still reaches rank 3";
    d.evidence(2, {0, 1});
    d.reportLinks(1, {0, 1});
    EXPECT_TRUE(d.coord().reconciling()) << "rank 2 sent evidence: it is alive";
    d.reportLinks(2, {2, 3});
    EXPECT_TRUE(d.coord().reconciling()) << "rank 2 reaches rank 3";
    auto fx = d.reportLinks(3, {2, 3});
    EXPECT_FALSE(d.coord().reconciling());
    auto res = effectsOf<ReconciliationResult>(fx);
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].healthy, (std::vector<uint32_t>{0, 1}));  // the tie goes low
}

// A slot a previous reconciliation judged Offline (its process never left)
// is not waited for again.
TEST(CoordinatorTest, WindowDoesNotWaitForAnEarlierCasualty) {
    auto d = bootstrapped(4, 4);
    d.evidence(0, {3});
    d.fullMesh({0, 1, 2});
    ASSERT_FALSE(d.coord().reconciling());
    ASSERT_EQ(d.view().slots[3].rank, RankState::kOffline);
    d.evidence(0, {2});
    d.reportLinks(0, {0, 1});
    EXPECT_TRUE(d.coord().reconciling());
    auto fx = d.reportLinks(1, {0, 1});
    EXPECT_FALSE(d.coord().reconciling());
    EXPECT_EQ(effectsOf<ReconciliationResult>(fx).at(0).healthy, (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 0, 0}));
}

TEST(CoordinatorTest, DeferredSyncModeAlsoDeactivates) {
    auto d = bootstrapped(8, 4, FailureMode{true, false});
    d.evidence(0, {3});
    d.reportLinks(0, {0, 1, 2});
    d.reportLinks(1, {0, 1, 2});
    auto fx = d.reportLinks(2, {0, 1, 2});
    ASSERT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 1, 0, 0, 0, 0, 0}));
}

TEST(CoordinatorTest, FrameworkManagedModeOnlyReports) {
    auto d = bootstrapped(8, 4, FailureMode{false, false});
    d.evidence(0, {3});
    d.reportLinks(0, {0, 1, 2});
    d.reportLinks(1, {0, 1, 2});
    auto fx = d.reportLinks(2, {0, 1, 2});
    auto res = effectsOf<ReconciliationResult>(fx);
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].unhealthy_active, (std::vector<uint32_t>{3}));
    EXPECT_FALSE(res[0].deactivated);
    // Membership is unchanged, but a fresh epoch restarts the data planes
    // the failed operation left out of step.
    auto commits = effectsOf<ViewCommitted>(fx);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_TRUE(commits[0].activated.empty());
    EXPECT_TRUE(commits[0].deactivated.empty());
    EXPECT_EQ(commits[0].active_mask, mask({1, 1, 1, 1, 0, 0, 0, 0}));
    EXPECT_EQ(d.view().slots[3].member, GMS::kActive);
    EXPECT_EQ(d.view().slots[3].rank, RankState::kOffline);
    EXPECT_EQ(d.view().epoch, 2u);
    EXPECT_FALSE(sentTo<ReconcileResult>(fx, 0).at(0).deactivated);
    // The framework decides.
    fx = d.deactivate(0, {3});
    EXPECT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(d.view().groupSize(), 3);
}

TEST(CoordinatorTest, HealthySetIsTheLargestConnectedGroupOfActives) {
    auto d = bootstrapped(8, 5);
    d.evidence(0, {3, 4});
    // {0,1,2} see each other, {3,4} see each other; no cross links. The
    // window closes on the last report.
    d.fullMesh({3, 4});
    d.reportLinks(0, {0, 1, 2});
    d.reportLinks(1, {0, 1, 2});
    auto fx = d.reportLinks(2, {0, 1, 2});
    auto res = effectsOf<ReconciliationResult>(fx).at(0);
    EXPECT_EQ(res.healthy, (std::vector<uint32_t>{0, 1, 2}));
    EXPECT_EQ(res.unhealthy_active, (std::vector<uint32_t>{3, 4}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 1, 0, 0, 0, 0, 0}));
}

TEST(CoordinatorTest, HealthySetTieBreaksByLowestRanks) {
    auto d = bootstrapped(4, 4);
    // Each side blames the other (with one accusation only, the blamed side
    // would lose: AnEarlyWindowWithOneAccusation... above).
    d.evidence(3, {0});
    d.evidence(0, {3});
    d.fullMesh({2, 3});  // reported first, but {0,1} wins the tie
    d.reportLinks(0, {0, 1});
    auto fx = d.reportLinks(1, {0, 1});
    auto res = effectsOf<ReconciliationResult>(fx).at(0);
    EXPECT_EQ(res.healthy, (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 0, 0}));
}

TEST(CoordinatorTest, NoHealthyActiveLeavesMembershipUnchanged) {
    auto d = bootstrapped(4, 2);
    d.evidence(0, {1});
    auto fx = d.tickAt(30000ms);  // nobody reported
    auto res = effectsOf<ReconciliationResult>(fx).at(0);
    EXPECT_TRUE(res.healthy.empty());
    EXPECT_FALSE(res.deactivated);
    EXPECT_EQ(d.view().groupSize(), 2);
    EXPECT_TRUE(logContains(fx, "membership unchanged"));
}

TEST(CoordinatorTest, StaleEpochEvidenceIgnored) {
    auto d = bootstrapped();
    d.prepareJoiner(4);
    d.activate(0, {4});
    ASSERT_EQ(d.view().epoch, 2u);
    ControlMessage m = d.message(1, FailureEvidence{5, false, {0, 0, 1, 0, 0, 0, 0, 0}});
    m.header.view_epoch = 1;
    auto fx = d.deliver(m);
    EXPECT_FALSE(d.coord().reconciling());
    EXPECT_TRUE(logContains(fx, "ignored stale evidence"));
    // The sender learns there is nothing to wait for and gets the view first.
    ASSERT_GE(fx.size(), 2u);
    const auto* view = std::get_if<SendTo>(&fx[0]);
    ASSERT_NE(view, nullptr);
    EXPECT_TRUE(std::holds_alternative<ViewUpdate>(view->message.body));
    auto acks = sentTo<EvidenceAck>(fx, 1);
    ASSERT_EQ(acks.size(), 1u);
    EXPECT_EQ(acks[0].reconcile_id, 0u);
    EXPECT_EQ(acks[0].request_id, 5u);
}

TEST(CoordinatorTest, EvidenceNamingOnlyNonActiveRanksIgnored) {
    auto d = bootstrapped();
    auto fx = d.evidence(0, {6});
    EXPECT_FALSE(d.coord().reconciling());
    EXPECT_TRUE(logContains(fx, "only names non-active ranks"));
    // Positive evidence never opens a window.
    d.evidence(0, {}, /*local_success=*/true);
    EXPECT_FALSE(d.coord().reconciling());
    // Negative evidence without a hint does.
    d.evidence(0, {});
    EXPECT_TRUE(d.coord().reconciling());
}

TEST(CoordinatorTest, StaleLinkReportEpochIgnored) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    ControlMessage m = d.message(4, LinkReport{0, {1, 1, 1, 1, 0, 0, 0, 0}});
    m.header.view_epoch = 0;
    auto fx = d.deliver(m);
    EXPECT_TRUE(logContains(fx, "stale epoch"));
    EXPECT_FALSE(sentTo<ViewUpdate>(fx, 4).empty());  // so it reports again
}

TEST(CoordinatorTest, ReplacementGetsHigherIncarnationAndOldEvidenceIsIgnored) {
    auto d = bootstrapped();
    const uint32_t old_inc = d.incarnation(2);
    // Rank 2 dies; rank 0 reports, the window removes it.
    d.evidence(0, {2});
    d.fullMesh({0, 1, 3});
    d.tickAt(30000ms);
    ASSERT_EQ(d.view().slots[2].member, GMS::kInactive);
    const uint64_t removal_epoch = d.view().epoch;

    // The replacement registers into the same slot with a higher incarnation.
    auto fx = d.registerRank(2, true, "ep-new");
    ASSERT_TRUE(sentTo<RegisterReply>(fx, 2).at(0).accepted);
    EXPECT_GT(d.incarnation(2), old_inc);
    EXPECT_EQ(d.view().slots[2].rank, RankState::kSynced);

    // Late messages from the dead process (old incarnation) are dropped.
    ControlMessage late = d.message(2, FailureEvidence{1, false, {1, 1, 0, 1, 0, 0, 0, 0}});
    late.header.sender_incarnation = old_inc;
    fx = d.deliver(late);
    EXPECT_TRUE(logContains(fx, "stale incarnation"));
    EXPECT_FALSE(d.coord().reconciling());
    late = d.message(2, LinkReport{0, {1, 1, 0, 1, 0, 0, 0, 0}});
    late.header.sender_incarnation = old_inc;
    fx = d.deliver(late);
    EXPECT_TRUE(logContains(fx, "stale incarnation"));

    // A link report about the old incarnation does not vouch for the new one.
    LinkReport about_old;
    about_old.reached = {0, 1, old_inc, 1, 0, 0, 0, 0};
    for (uint32_t a : {0u, 1u, 3u})
        d.send(a, about_old);
    d.reportLinks(2, {0, 1, 3});
    EXPECT_EQ(d.view().slots[2].rank, RankState::kSynced);
    d.fullMesh({0, 1, 2, 3});
    EXPECT_EQ(d.view().slots[2].rank, RankState::kHealthy);

    d.send(2, JoinRequest{0});
    fx = d.activate(0, {2});
    ASSERT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(d.view().groupSize(), 4);

    // Evidence from the removal epoch blaming rank 2 arrives late: ignored,
    // so the replacement is not blamed.
    ControlMessage old_blame = d.message(1, FailureEvidence{2, false, {0, 0, 1, 0, 0, 0, 0, 0}});
    old_blame.header.view_epoch = removal_epoch;
    fx = d.deliver(old_blame);
    EXPECT_FALSE(d.coord().reconciling());
    EXPECT_EQ(d.view().slots[2].member, GMS::kActive);
}

TEST(CoordinatorTest, DeactivateProposalAboutAReplacedProcessSkipsIt) {
    auto d = bootstrapped();
    const uint32_t old_inc = d.incarnation(2);
    d.deactivate(0, {2});
    d.registerRank(2, true);
    d.fullMesh({0, 1, 2, 3});
    d.send(2, JoinRequest{0});
    d.activate(0, {2});
    ASSERT_EQ(d.view().slots[2].member, GMS::kActive);
    DeactivateProposal p{9, {RankRef{2, old_inc}}};
    auto fx = d.send(1, p);
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());
    auto res = sentTo<ProposalResult>(fx, 1).at(0);
    EXPECT_EQ(res.code, StatusCode::kOk);
    EXPECT_NE(res.reason.find("rank 2 skipped"), std::string::npos);
    EXPECT_EQ(d.view().slots[2].member, GMS::kActive);
}

TEST(CoordinatorTest, ReplacementForAnActiveSlotIsRefusedAndOpensAWindow) {
    auto d = bootstrapped();
    auto fx = d.registerRank(1, true, "ep-new");
    auto reply = sentTo<RegisterReply>(fx, 1).at(0);
    EXPECT_FALSE(reply.accepted);
    EXPECT_NE(reply.reason.find("must be deactivated"), std::string::npos);
    EXPECT_TRUE(d.coord().reconciling());
    EXPECT_EQ(d.incarnation(1), 1u);
    // The old process is silent through the window, so it is removed, and
    // the replacement's retry succeeds.
    d.fullMesh({0, 2, 3});
    d.tickAt(30000ms);
    EXPECT_EQ(d.view().slots[1].member, GMS::kInactive);
    fx = d.registerRank(1, true, "ep-new");
    EXPECT_TRUE(sentTo<RegisterReply>(fx, 1).at(0).accepted);
    EXPECT_EQ(d.incarnation(1), 2u);
}

// ---- admission -----------------------------------------------------------

TEST(CoordinatorTest, BadSecretWrongGroupAndNonMembersAreDropped) {
    auto d = bootstrapped();
    const GroupView before = d.view();

    ControlMessage m = d.message(1, DeactivateProposal{1, {RankRef{2, 0}}});
    m.header.secret = "wrong";
    auto fx = d.deliver(m);
    EXPECT_TRUE(logContains(fx, "secret does not match"));
    EXPECT_TRUE(effectsOf<SendTo>(fx).empty());

    m = d.message(1, DeactivateProposal{1, {RankRef{2, 0}}});
    m.header.group_id = "other";
    fx = d.deliver(m);
    EXPECT_TRUE(logContains(fx, "group id"));

    m = d.message(0, RegisterRequest{99, true, "ep"});
    m.header.sender_rank = 8;
    fx = d.deliver(m);
    EXPECT_TRUE(logContains(fx, "not a slot of this group"));
    m.header.sender_rank = kCoordinatorSender;
    fx = d.deliver(m);
    EXPECT_TRUE(logContains(fx, "not a slot of this group"));

    // Members never send views.
    fx = d.send(0, ViewUpdate{});
    EXPECT_TRUE(logContains(fx, "members do not send"));

    // Unregistered slot.
    fx = d.send(5, JoinRequest{0});
    EXPECT_TRUE(logContains(fx, "no registered process"));

    // Undecodable bytes.
    fx = d.coord().handleBytes(0ms, "garbage");
    EXPECT_TRUE(logContains(fx, "undecodable"));

    EXPECT_EQ(d.view().revision, before.revision);
    EXPECT_EQ(d.view().slots, before.slots);
}

TEST(CoordinatorTest, TimeNeverRunsBackwards) {
    auto d = bootstrapped();
    d.tickAt(10000ms);
    d.registerRank(4, true);
    d.send(4, JoinRequest{1000});
    // A late event with an earlier timestamp does not move the deadline.
    d.tickAt(0ms);
    EXPECT_EQ(d.coord().nextDeadline(), Millis(11000));
}

// A rank stalled in a collective while its control plane still answers: the
// first survivor whose op times out blames it, and every process (the
// stalled one included) reports its links before the other survivors' ops
// time out, so the window closes with one missing link, accuser to blamed.
// Both 3-member cliques keep as many Active members; the blamed rank goes.
TEST(CoordinatorTest, AnEarlyWindowWithOneAccusationDeactivatesTheBlamedNotTheAccuser) {
    auto d = bootstrapped();
    d.tickAt(1000ms);
    d.evidence(3, {2});
    ASSERT_TRUE(d.coord().reconciling());
    d.reportLinks(0, {0, 1, 2, 3});
    d.reportLinks(1, {0, 1, 2, 3});
    d.reportLinks(2, {0, 1, 2, 3});
    auto fx = d.reportLinks(3, {0, 1, 3});
    EXPECT_FALSE(d.coord().reconciling()) << "everyone reported: the window closes early";
    auto res = effectsOf<ReconciliationResult>(fx);
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].healthy, (std::vector<uint32_t>{0, 1, 3}));
    EXPECT_EQ(res[0].unhealthy_active, (std::vector<uint32_t>{2}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 0, 1, 0, 0, 0, 0}));
}

// ---- healthy-set choice --------------------------------------------------

TEST(HealthySetTest, BreaksATieOfSizeAgainstTheBlamed) {
    // Five Active candidates, every link but 2-3: {0,1,2,4} and {0,1,3,4}.
    LinkGraph g(5);
    for (size_t a = 0; a < 5; ++a) {
        for (size_t b = a + 1; b < 5; ++b) {
            if (!(a == 2 && b == 3))
                g.connect(a, b);
        }
    }
    const std::vector<bool> active(5, true);
    EXPECT_EQ(chooseHealthySet(g, active).members, (std::vector<size_t>{0, 1, 2, 4}));
    EXPECT_EQ(chooseHealthySet(g, active, {false, false, true, false, false}).members,
              (std::vector<size_t>{0, 1, 3, 4}));
    EXPECT_EQ(chooseHealthySet(g, active, {false, false, false, true, false}).members,
              (std::vector<size_t>{0, 1, 2, 4}));
    // Blame alone removes no one: it only breaks ties between cliques.
    g.connect(2, 3);
    EXPECT_EQ(chooseHealthySet(g, active, {false, false, true, true, false}).members,
              (std::vector<size_t>{0, 1, 2, 3, 4}));
}

TEST(HealthySetTest, PrefersActiveMembersOverMoreProcesses) {
    // 0,1 Active and linked; 2,3,4 inactive, linked to each other and to 0.
    LinkGraph g(5);
    g.connect(0, 1);
    for (size_t a : {2u, 3u, 4u}) {
        g.connect(0, a);
        for (size_t b : {2u, 3u, 4u}) {
            if (a < b)
                g.connect(a, b);
        }
    }
    auto c = chooseHealthySet(g, {true, true, false, false, false});
    EXPECT_EQ(c.members, (std::vector<size_t>{0, 1}));
    EXPECT_TRUE(c.exact);
    // Without the preference, the bigger clique wins.
    c = chooseHealthySet(g, {false, false, false, false, false});
    EXPECT_EQ(c.members, (std::vector<size_t>{0, 2, 3, 4}));
}

TEST(HealthySetTest, ExtendsWithNonActivesAndBreaksTiesLow) {
    LinkGraph g(4);
    g.connect(0, 2);
    g.connect(1, 3);
    g.connect(0, 3);
    // Cliques with one Active (0 or 1) and one other: {0,2},{0,3},{1,3}.
    auto c = chooseHealthySet(g, {true, true, false, false});
    EXPECT_EQ(c.members, (std::vector<size_t>{0, 2}));
    EXPECT_TRUE(chooseHealthySet(LinkGraph(0), {}).members.empty());
}

TEST(HealthySetTest, LargeGraphsUseTheGreedyRule) {
    const size_t n = kExactCandidateLimit + 4;
    LinkGraph g(n);
    for (size_t a = 0; a < n; ++a) {
        for (size_t b = a + 1; b < n; ++b) {
            if (a != 7 && b != 7)
                g.connect(a, b);  // 7 is cut off
        }
    }
    std::vector<bool> pref(n, true);
    auto c = chooseHealthySet(g, pref);
    EXPECT_FALSE(c.exact);
    EXPECT_EQ(c.members.size(), n - 1);
    EXPECT_EQ(std::count(c.members.begin(), c.members.end(), 7u), 0);
}

TEST(HealthySetTest, TheGreedyRuleDropsTheBlamedOfTwoEqualCandidates) {
    const size_t n = kExactCandidateLimit + 4;
    LinkGraph g(n);
    for (size_t a = 0; a < n; ++a) {
        for (size_t b = a + 1; b < n; ++b) {
            if (!(a == 5 && b == 9))
                g.connect(a, b);  // only 5-9 is missing
        }
    }
    const std::vector<bool> pref(n, true);
    auto c = chooseHealthySet(g, pref);
    ASSERT_FALSE(c.exact);
    EXPECT_EQ(std::count(c.members.begin(), c.members.end(), 9u), 0) << "the higher index goes";
    std::vector<bool> blamed(n, false);
    blamed[5] = true;
    c = chooseHealthySet(g, pref, blamed);
    EXPECT_EQ(c.members.size(), n - 1);
    EXPECT_EQ(std::count(c.members.begin(), c.members.end(), 5u), 0) << "the blamed goes";
}

}  // namespace
}  // namespace mooncake::pg::control_plane::testing
