// Coordinator transitions, driven event by event without sockets or threads.
#include <gtest/gtest.h>

#include "mooncake-pg/control_plane/coordinator.h"
#include "tests/cpp/pg/control_plane_test_util.h"

namespace mooncake::pg::control_plane::testing {
namespace {

using GMS = GroupMemberState;

// ---- configuration ---------------------------------------------------------

TEST(FailureModeTest, ThreeLegalModesOneIllegal) {
    EXPECT_TRUE(validateFailureMode({true, true}).ok());
    EXPECT_TRUE(validateFailureMode({true, false}).ok());
    EXPECT_TRUE(validateFailureMode({false, false}).ok());
    Status bad = validateFailureMode({false, true});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.message().find("auto_sync_on_failure=True requires auto_deactivate_on_failure"),
              std::string::npos);
    EXPECT_STREQ(failureModeName({true, true}), "pg-managed");
    EXPECT_STREQ(failureModeName({true, false}), "pg-managed-deferred-sync");
    EXPECT_STREQ(failureModeName({false, false}), "framework-managed");
}

TEST(FailureModeTest, IllegalModeRejectedAtConstruction) {
    auto c = Coordinator::create(coordinatorConfig(4, 2, FailureMode{false, true}));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("auto_deactivate_on_failure"), std::string::npos);
}

TEST(FailureModeTest, WindowMustExceedCollectiveTimeout) {
    auto cfg = coordinatorConfig(4, 2);
    cfg.collective_timeout = 30s;
    EXPECT_FALSE(Coordinator::create(cfg).ok());
    cfg.collective_timeout = 20s;
    EXPECT_TRUE(Coordinator::create(cfg).ok());
    cfg.reconcile_window = 0ms;
    EXPECT_FALSE(Coordinator::create(cfg).ok());
}

TEST(CoordinatorConfigTest, SizesValidated) {
    EXPECT_FALSE(Coordinator::create(coordinatorConfig(0, 0)).ok());
    EXPECT_FALSE(Coordinator::create(coordinatorConfig(4, 5)).ok());
    EXPECT_FALSE(Coordinator::create(coordinatorConfig(kMaxGroupSlots + 1, 1)).ok());
    auto cfg = coordinatorConfig(4, 2);
    cfg.group_id.clear();
    EXPECT_FALSE(Coordinator::create(cfg).ok());
}

TEST(StatesTest, Names) {
    EXPECT_STREQ(rankStateName(RankState::kHealthy), "Healthy");
    EXPECT_STREQ(groupMemberStateName(GMS::kAwaitingActivation), "AwaitingActivation");
    EXPECT_FALSE(rankStateFromWire(3).has_value());
    EXPECT_FALSE(groupMemberStateFromWire(5).has_value());
}

// ---- bootstrap and registration ------------------------------------------

TEST(CoordinatorTest, FoundersBecomeActiveTogetherAtBootstrap) {
    CoordinatorDriver d(coordinatorConfig(4, 2));
    auto fx = d.registerRank(0, false);
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());
    EXPECT_EQ(d.view().slots[0].rank, RankState::kSynced);
    EXPECT_EQ(d.view().slots[0].member, GMS::kNone);
    EXPECT_EQ(d.view().epoch, 0u);

    fx = d.registerRank(1, false);
    auto commits = effectsOf<ViewCommitted>(fx);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].epoch, 1u);
    EXPECT_EQ(commits[0].active_mask, mask({1, 1, 0, 0}));
    EXPECT_EQ(commits[0].group_size, 2);
    EXPECT_TRUE(d.view().bootstrapped);
    for (uint32_t r : {0u, 1u}) {
        EXPECT_EQ(d.view().slots[r].member, GMS::kActive);
        EXPECT_EQ(d.view().slots[r].rank, RankState::kHealthy);
    }
    // The registrant's reply goes first, then the view to both founders,
    // then everything else.
    ASSERT_GE(fx.size(), 2u);
    const auto* reply = std::get_if<SendTo>(&fx[0]);
    ASSERT_NE(reply, nullptr);
    EXPECT_TRUE(std::holds_alternative<RegisterReply>(reply->message.body));
    const auto* b = std::get_if<Broadcast>(&fx[1]);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->ranks, (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(b->message.header.view_epoch, 1u);
}

TEST(CoordinatorTest, RegistrationRules) {
    CoordinatorDriver d(coordinatorConfig(4, 2));
    // An extension cannot take a founder's slot before bootstrap.
    auto fx = d.registerRank(1, true);
    auto replies = sentTo<RegisterReply>(fx, 1);
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_FALSE(replies[0].accepted);
    EXPECT_NE(replies[0].reason.find("reserved for a founding member"), std::string::npos);
    // A non-extension outside the founding range is refused.
    fx = d.registerRank(3, false);
    EXPECT_FALSE(sentTo<RegisterReply>(fx, 3).at(0).accepted);

    d.bootstrap();
    // After bootstrap, a non-extension registration is refused.
    fx = d.registerRank(2, false);
    replies = sentTo<RegisterReply>(fx, 2);
    EXPECT_FALSE(replies.at(0).accepted);
    EXPECT_NE(replies[0].reason.find("is_extension=True"), std::string::npos);

    // A retransmitted registration (same nonce) is answered the same way.
    fx = d.registerRank(2, true, "ep2", 4242);
    ASSERT_TRUE(sentTo<RegisterReply>(fx, 2).at(0).accepted);
    uint32_t inc = d.incarnation(2);
    fx = d.registerRank(2, true, "ep2", 4242);
    EXPECT_EQ(sentTo<RegisterReply>(fx, 2).at(0).incarnation, inc);
    EXPECT_EQ(d.view().slots[2].incarnation, inc);
    EXPECT_EQ(d.view().slots[2].member, GMS::kInactive);
}

// ---- join and activation -------------------------------------------------

TEST(CoordinatorTest, JoinInactiveAwaitingActive) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    EXPECT_EQ(d.view().slots[4].member, GMS::kInactive);
    EXPECT_EQ(d.view().slots[4].rank, RankState::kSynced);

    // Links in both directions with every active member make it Healthy.
    d.fullMesh({0, 1, 2, 3, 4});
    EXPECT_EQ(d.view().slots[4].rank, RankState::kHealthy);
    EXPECT_EQ(d.view().slots[4].member, GMS::kInactive);

    auto fx = d.send(4, JoinRequest{0});
    EXPECT_EQ(d.view().slots[4].member, GMS::kAwaitingActivation);
    EXPECT_FALSE(sentTo<ViewUpdate>(fx, 0).empty());  // members see the joiner
    EXPECT_EQ(d.view().epoch, 1u);                    // no active-set change yet

    fx = d.activate(0, {4});
    auto commits = effectsOf<ViewCommitted>(fx);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].epoch, 2u);
    EXPECT_EQ(commits[0].activated, (std::vector<uint32_t>{4}));
    EXPECT_EQ(d.view().slots[4].member, GMS::kActive);
    auto results = sentTo<ProposalResult>(fx, 0);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].code, StatusCode::kOk);
    // The joiner gets the view that shows it Active.
    auto views = sentTo<ViewUpdate>(fx, 4);
    ASSERT_EQ(views.size(), 1u);
    EXPECT_EQ(views[0].slots[4].member, GMS::kActive);
    EXPECT_EQ(d.coord().pendingProposals(), 0u);
}

TEST(CoordinatorTest, ScaleUpIntoReservedNeverUsedSlot) {
    auto d = bootstrapped(8, 4);
    EXPECT_EQ(d.view().groupSize(), 4);
    d.prepareJoiner(4);
    d.activate(0, {4});
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 1, 1, 1, 0, 0, 0}));
    EXPECT_EQ(d.view().groupSize(), 5);
}

TEST(CoordinatorTest, HolesCountTowardsSize) {
    auto d = bootstrapped(4, 3);
    EXPECT_EQ(d.view().groupSize(), 3);
    d.deactivate(0, {1});
    EXPECT_EQ(d.view().activeMask(), mask({1, 0, 1, 0}));
    EXPECT_EQ(d.view().groupSize(), 3);
    EXPECT_EQ(groupSizeFromMask(mask({1, 0, 1, 0})), 3);
    EXPECT_EQ(groupSizeFromMask(mask({1, 1, 0, 1, 1, 0, 0, 0})), 5);
    EXPECT_EQ(groupSizeFromMask(mask({0, 0})), 0);
}

TEST(CoordinatorTest, ActivationPendsUntilTargetHealthyThenFailsAtDeadline) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    d.send(4, JoinRequest{0});  // AwaitingActivation but no link reports
    auto fx = d.activate(0, {4}, 9, 5000);
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());
    EXPECT_EQ(d.coord().pendingProposals(), 1u);
    EXPECT_EQ(d.coord().nextDeadline(), Millis(5000));

    fx = d.tickAt(4999ms);
    EXPECT_TRUE(effectsOf<ProposalFailed>(fx).empty());
    fx = d.tickAt(5000ms);
    auto failed = effectsOf<ProposalFailed>(fx);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].request_id, 9u);
    EXPECT_EQ(failed[0].reason.rfind("proposal failed: ", 0), 0u);
    EXPECT_NE(failed[0].reason.find("rank 4 is Synced, expected Healthy"), std::string::npos);
    auto results = sentTo<ProposalResult>(fx, 0);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].code, StatusCode::kTimeout);
    EXPECT_EQ(d.view().slots[4].member, GMS::kAwaitingActivation);
    EXPECT_EQ(d.coord().pendingProposals(), 0u);
}

TEST(CoordinatorTest, ActivationRefusedWhileTargetNotAwaiting) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    d.fullMesh({0, 1, 2, 3, 4});  // Healthy, but never called join_group
    d.activate(0, {4}, 1, 1000);
    auto fx = d.tickAt(1000ms);
    auto failed = effectsOf<ProposalFailed>(fx);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_NE(failed[0].reason.find("rank 4 is Inactive, expected AwaitingActivation"),
              std::string::npos);
}

TEST(CoordinatorTest, ActivationWaitsForEndpointAndCommitsWhenPublished) {
    auto d = bootstrapped();
    d.registerRank(4, true, /*endpoint=*/"");
    d.fullMesh({0, 1, 2, 3, 4});
    d.send(4, JoinRequest{0});
    auto fx = d.activate(0, {4}, 1, 5000);
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());

    // Without the endpoint it fails with that reason...
    CoordinatorDriver d2 = d;
    fx = d2.tickAt(5000ms);
    ASSERT_EQ(effectsOf<ProposalFailed>(fx).size(), 1u);
    EXPECT_NE(effectsOf<ProposalFailed>(fx)[0].reason.find("rank 4 has not published an endpoint"),
              std::string::npos);

    // ...and once published before the deadline, the pending proposal commits.
    d.tickAt(1000ms);
    fx = d.send(4, PublishEndpoint{"tcp://host4:1234"});
    ASSERT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(d.view().slots[4].member, GMS::kActive);
    EXPECT_EQ(sentTo<ProposalResult>(fx, 0).at(0).code, StatusCode::kOk);
}

TEST(CoordinatorTest, ActivationRefusedWhenResultNotPairwiseConnected) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    d.registerRank(5, true);
    // Both reach every active member, but not each other.
    d.fullMesh({0, 1, 2, 3, 4});
    d.reportLinks(5, {0, 1, 2, 3});
    for (uint32_t a : {0u, 1u, 2u, 3u})
        d.reportLinks(a, {0, 1, 2, 3, 4, 5});
    EXPECT_EQ(d.view().slots[4].rank, RankState::kHealthy);
    EXPECT_EQ(d.view().slots[5].rank, RankState::kHealthy);
    d.send(4, JoinRequest{0});
    d.send(5, JoinRequest{0});

    d.activate(0, {4, 5}, 1, 3000);
    auto fx = d.tickAt(3000ms);
    auto failed = effectsOf<ProposalFailed>(fx);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_NE(failed[0].reason.find("not pairwise connected: ranks 4 and 5"), std::string::npos);
    EXPECT_EQ(d.view().slots[4].member, GMS::kAwaitingActivation);

    // Either one alone is fine.
    fx = d.activate(0, {4}, 2);
    EXPECT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
}

TEST(CoordinatorTest, OneWayLinkIsNotEnough) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    d.reportLinks(4, {0, 1, 2, 3});  // the joiner reaches everyone...
    for (uint32_t a : {0u, 1u, 2u})
        d.reportLinks(a, {0, 1, 2, 3, 4});
    d.reportLinks(3, {0, 1, 2});  // ...but rank 3 does not reach it
    EXPECT_EQ(d.view().slots[4].rank, RankState::kSynced);
    d.reportLinks(3, {0, 1, 2, 4});
    EXPECT_EQ(d.view().slots[4].rank, RankState::kHealthy);
    // And a later report that loses it demotes it again.
    d.reportLinks(3, {0, 1, 2});
    EXPECT_EQ(d.view().slots[4].rank, RankState::kSynced);
}

TEST(CoordinatorTest, ActivationBlockedDuringReconciliation) {
    auto d = bootstrapped();
    d.prepareJoiner(4);
    d.evidence(1, {2});  // opens the window at t=0
    ASSERT_TRUE(d.coord().reconciling());
    d.activate(0, {4}, 1, 5000);
    auto fx = d.tickAt(5000ms);
    auto failed = effectsOf<ProposalFailed>(fx);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_NE(failed[0].reason.find("failure reconciliation #1 is in progress"), std::string::npos);
}

TEST(CoordinatorTest, PendingActivationCommitsAfterReconciliationCloses) {
    auto d = bootstrapped();
    d.prepareJoiner(4);
    d.evidence(1, {2});
    d.activate(0, {4}, 1, 60000);
    // Everyone reports during the window, so nobody is removed; the window
    // closes on the last report.
    for (uint32_t r : {0u, 1u, 2u, 3u})
        d.reportLinks(r, {0, 1, 2, 3, 4});
    EXPECT_TRUE(d.coord().reconciling());
    EXPECT_EQ(d.view().slots[4].member, GMS::kAwaitingActivation);
    auto fx = d.reportLinks(4, {0, 1, 2, 3, 4});
    EXPECT_FALSE(d.coord().reconciling());
    ASSERT_EQ(effectsOf<ReconciliationResult>(fx).size(), 1u);
    EXPECT_TRUE(effectsOf<ReconciliationResult>(fx)[0].unhealthy_active.empty());
    // First the resync epoch that closes the reconciliation, then the activation.
    auto commits = effectsOf<ViewCommitted>(fx);
    ASSERT_EQ(commits.size(), 2u);
    EXPECT_TRUE(commits[0].activated.empty());
    EXPECT_EQ(commits[1].activated, (std::vector<uint32_t>{4}));
    EXPECT_EQ(d.view().slots[4].member, GMS::kActive);
}

TEST(CoordinatorTest, RedundantActivateProposalsAreIdempotent) {
    auto d = bootstrapped();
    d.prepareJoiner(4);
    auto fx = d.activate(0, {4}, 1);
    ASSERT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    const uint64_t epoch = d.view().epoch;
    // Another member proposes the same thing: success, no new epoch.
    fx = d.activate(1, {4}, 1);
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());
    EXPECT_EQ(sentTo<ProposalResult>(fx, 1).at(0).code, StatusCode::kOk);
    EXPECT_EQ(d.view().epoch, epoch);
    // The same proposer again: same.
    fx = d.activate(0, {4}, 3);
    EXPECT_EQ(sentTo<ProposalResult>(fx, 0).at(0).code, StatusCode::kOk);
    EXPECT_EQ(d.view().epoch, epoch);
}

TEST(CoordinatorTest, RedundantPendingProposalsCommitOnce) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    d.send(4, JoinRequest{0});
    d.activate(0, {4}, 1);
    d.activate(2, {4}, 1);
    d.activate(0, {4}, 1);  // retransmission of the first: ignored
    EXPECT_EQ(d.coord().pendingProposals(), 2u);
    auto fx = d.tickAt(1ms);
    d.fullMesh({0, 1, 2, 3});
    fx = d.reportLinks(4, {0, 1, 2, 3});
    for (uint32_t a : {0u, 1u, 2u})
        d.reportLinks(a, {0, 1, 2, 3, 4});
    fx = d.reportLinks(3, {0, 1, 2, 4});
    EXPECT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(sentTo<ProposalResult>(fx, 0).size(), 1u);
    EXPECT_EQ(sentTo<ProposalResult>(fx, 2).size(), 1u);
    EXPECT_EQ(d.coord().pendingProposals(), 0u);
}

TEST(CoordinatorTest, ProposalsRejectedOnArrival) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    // An Inactive process cannot propose.
    auto fx = d.activate(4, {4});
    EXPECT_NE(effectsOf<ProposalFailed>(fx).at(0).reason.find("only an Active member"),
              std::string::npos);
    EXPECT_EQ(sentTo<ProposalResult>(fx, 4).at(0).code, StatusCode::kInvalidArgument);
    fx = d.activate(0, {8});
    EXPECT_NE(effectsOf<ProposalFailed>(fx).at(0).reason.find("outside max_group_size 8"),
              std::string::npos);
    fx = d.activate(0, {});
    EXPECT_EQ(effectsOf<ProposalFailed>(fx).size(), 1u);
    fx = d.deactivate(0, {0, 1, 2, 3});
    EXPECT_NE(effectsOf<ProposalFailed>(fx).at(0).reason.find("no Active member"),
              std::string::npos);
    EXPECT_EQ(d.view().groupSize(), 4);
}

// ---- deactivation --------------------------------------------------------

TEST(CoordinatorTest, DeactivateMakesTargetsInactiveInANewView) {
    auto d = bootstrapped();
    auto fx = d.deactivate(3, {2});
    auto commits = effectsOf<ViewCommitted>(fx);
    ASSERT_EQ(commits.size(), 1u);
    EXPECT_EQ(commits[0].epoch, 2u);
    EXPECT_EQ(commits[0].deactivated, (std::vector<uint32_t>{2}));
    EXPECT_EQ(d.view().activeMask(), mask({1, 1, 0, 1, 0, 0, 0, 0}));
    EXPECT_EQ(d.view().slots[2].member, GMS::kInactive);
    EXPECT_EQ(sentTo<ProposalResult>(fx, 3).at(0).code, StatusCode::kOk);
    // All members, including the deactivated one, get the new view.
    EXPECT_EQ(sentTo<ViewUpdate>(fx, 2).size(), 1u);
    // Idempotent: again is a no-op success.
    fx = d.deactivate(0, {2});
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());
    EXPECT_EQ(sentTo<ProposalResult>(fx, 0).at(0).code, StatusCode::kOk);
    EXPECT_EQ(d.view().epoch, 2u);
}

TEST(CoordinatorTest, DeactivatedMemberCanRejoinInPlace) {
    auto d = bootstrapped();
    d.deactivate(0, {2});
    d.send(2, JoinRequest{0});
    EXPECT_EQ(d.view().slots[2].member, GMS::kAwaitingActivation);
    auto fx = d.activate(0, {2});
    ASSERT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(d.view().groupSize(), 4);
    EXPECT_EQ(d.incarnation(2), 1u);  // same process, same incarnation
}

TEST(CoordinatorTest, DeactivatingAJoinerRejectsItsJoin) {
    auto d = bootstrapped();
    d.prepareJoiner(4);
    auto fx = d.deactivate(0, {4});
    EXPECT_TRUE(effectsOf<ViewCommitted>(fx).empty());  // active set unchanged
    EXPECT_EQ(d.view().slots[4].member, GMS::kInactive);
    auto rej = sentTo<JoinRejected>(fx, 4);
    ASSERT_EQ(rej.size(), 1u);
    EXPECT_EQ(rej[0].code, StatusCode::kAborted);
    EXPECT_EQ(effectsOf<JoinFailed>(fx).size(), 1u);
}

TEST(CoordinatorTest, LeaveFreesTheSlot) {
    auto d = bootstrapped();
    auto fx = d.send(3, Leave{});
    EXPECT_EQ(d.view().slots[3].member, GMS::kLeft);
    EXPECT_EQ(d.view().slots[3].rank, RankState::kOffline);
    EXPECT_EQ(effectsOf<ViewCommitted>(fx).size(), 1u);
    EXPECT_EQ(d.view().groupSize(), 3);
    // Its messages are no longer accepted; a new process may take the slot.
    fx = d.send(3, JoinRequest{0});
    EXPECT_TRUE(logContains(fx, "no registered process"));
    d.registerRank(3, true);
    EXPECT_EQ(d.incarnation(3), 2u);
    EXPECT_EQ(d.view().slots[3].member, GMS::kInactive);
}

// ---- join deadline -------------------------------------------------------

TEST(CoordinatorTest, JoinWithNobodyActivatingFailsAtItsDeadline) {
    auto d = bootstrapped();
    d.registerRank(4, true);
    d.fullMesh({0, 1, 2, 3, 4});
    d.send(4, JoinRequest{5000});
    EXPECT_EQ(d.coord().nextDeadline(), Millis(5000));
    auto fx = d.tickAt(4999ms);
    EXPECT_TRUE(effectsOf<JoinFailed>(fx).empty());
    fx = d.tickAt(5000ms);
    auto failed = effectsOf<JoinFailed>(fx);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].rank, 4u);
    EXPECT_NE(failed[0].reason.find("no online member proposed activate_ranks/recover_ranks"),
              std::string::npos);
    auto rej = sentTo<JoinRejected>(fx, 4);
    ASSERT_EQ(rej.size(), 1u);
    EXPECT_EQ(rej[0].code, StatusCode::kTimeout);
    EXPECT_EQ(d.view().slots[4].member, GMS::kInactive);
    EXPECT_FALSE(d.coord().nextDeadline().has_value());
}

TEST(CoordinatorTest, JoinTimeoutNamesWhatBlockedActivation) {
    auto d = bootstrapped();
    d.registerRank(4, true);  // no links: never Healthy
    d.send(4, JoinRequest{5000});
    d.activate(0, {4}, 1, 60000);
    auto fx = d.tickAt(5000ms);
    auto failed = effectsOf<JoinFailed>(fx);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_NE(failed[0].reason.find("expected Healthy"), std::string::npos);
}

}  // namespace
}  // namespace mooncake::pg::control_plane::testing
