// MemberAgent flows, the agent alone (control_plane_cluster_test.cc wires it
// to a Coordinator).
#include <gtest/gtest.h>

#include "tests/cpp/pg/control_plane_cluster.h"

namespace mooncake::pg::control_plane::testing {
namespace {

// ---- the agent alone -----------------------------------------------------

TEST(MemberAgentTest, ConfigValidation) {
    EXPECT_TRUE(MemberAgent::create(agentConfig(0, 4, false, 1)).ok());
    auto bad = MemberAgent::create(agentConfig(0, 4, false, 1, FailureMode{false, true}));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("auto_deactivate_on_failure"), std::string::npos);
    EXPECT_FALSE(MemberAgent::create(agentConfig(4, 4, false, 1)).ok());
    EXPECT_FALSE(MemberAgent::create(agentConfig(0, 4, false, 0)).ok());
}

TEST(MemberAgentTest, LocalQueriesReadTheMirror) {
    auto a = std::move(MemberAgent::create(agentConfig(0, 6, false, 1)).value());
    EXPECT_EQ(a.activeRanks(), (std::vector<int32_t>{0, 0, 0, 0, 0, 0}));
    EXPECT_EQ(a.groupSize(), 0);

    ViewUpdate v;
    v.revision = 5;
    v.bootstrapped = true;
    v.slots = {
        {GMS::kActive, RankState::kHealthy, 1, "e0"},
        {GMS::kInactive, RankState::kHealthy, 1, "e1"},
        {GMS::kActive, RankState::kHealthy, 1, "e2"},
        {GMS::kAwaitingActivation, RankState::kHealthy, 1, "e3"},
        {GMS::kAwaitingActivation, RankState::kSynced, 1, "e4"},
        {GMS::kAwaitingActivation, RankState::kHealthy, 1, ""},
    };
    auto fx = a.handle(Received{0ms, fromCoordinator(v, 3)});
    auto applied = effectsOf<ViewApplied>(fx);
    ASSERT_EQ(applied.size(), 1u);
    EXPECT_EQ(applied[0].epoch, 3u);
    EXPECT_EQ(applied[0].group_size, 3);
    EXPECT_TRUE(applied[0].active_set_changed);
    EXPECT_EQ(a.activeRanks(), (std::vector<int32_t>{1, 0, 1, 0, 0, 0}));
    EXPECT_EQ(a.groupSize(), 3);  // [1,0,1]: the hole counts
    // Ready = (AwaitingActivation & Healthy & endpoint published) or Active.
    EXPECT_EQ(a.peerState({3, 4, 5, 0, 1, 99}),
              (std::vector<bool>{true, false, false, true, false, false}));
    EXPECT_EQ(a.numSyncedRanks(), 5);

    // An older or equal revision is ignored.
    v.slots[2].member = GMS::kInactive;
    fx = a.handle(Received{0ms, fromCoordinator(v, 3)});
    EXPECT_TRUE(effectsOf<ViewApplied>(fx).empty());
    EXPECT_EQ(a.groupSize(), 3);
    v.revision = 6;
    fx = a.handle(Received{0ms, fromCoordinator(v, 4)});
    EXPECT_EQ(a.groupSize(), 1);
}

TEST(MemberAgentTest, DropsMessagesNotFromItsCoordinator) {
    auto a = std::move(MemberAgent::create(agentConfig(0, 2, false, 1)).value());
    ViewUpdate v{1, true, {{GMS::kActive, RankState::kHealthy, 1, ""}, {}}};
    ControlMessage m = fromCoordinator(v, 1);
    m.header.secret = "nope";
    auto fx = a.handle(Received{0ms, m});
    EXPECT_TRUE(effectsOf<ViewApplied>(fx).empty());
    EXPECT_FALSE(effectsOf<Log>(fx).empty());
    m = fromCoordinator(v, 1);
    m.header.sender_rank = 1;
    EXPECT_TRUE(effectsOf<ViewApplied>(a.handle(Received{0ms, m})).empty());
    m = fromCoordinator(v, 1);
    m.header.group_id = "x";
    EXPECT_TRUE(effectsOf<ViewApplied>(a.handle(Received{0ms, m})).empty());
    EXPECT_EQ(a.groupSize(), 0);
}

TEST(MemberAgentTest, CommandsValidateLocally) {
    auto a = std::move(MemberAgent::create(agentConfig(1, 4, true, 9)).value());
    auto fx = a.handle(JoinGroupCmd{0ms, 1, 0ms});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_EQ(completions(fx)[0].status.code(), StatusCode::kInvalidArgument);

    fx = a.handle(RegisterCmd{0ms, 2, "ep"});
    auto regs = sentBodies<RegisterRequest>(fx);
    ASSERT_EQ(regs.size(), 1u);
    EXPECT_EQ(regs[0].nonce, 9u);
    EXPECT_TRUE(regs[0].is_extension);
    fx = a.handle(Received{1ms, fromCoordinator(RegisterReply{9, true, 1, ""}, 1)});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_TRUE(completions(fx)[0].status.ok());
    EXPECT_EQ(a.incarnation(), 1u);

    // Not Active: proposals are refused here already.
    fx = a.handle(ActivateRanksCmd{1ms, 3, {2}, 0ms});
    EXPECT_NE(completions(fx).at(0).status.message().find("must be called on an Active member"),
              std::string::npos);
    fx = a.handle(ActivateRanksCmd{1ms, 4, {7}, 0ms});
    EXPECT_NE(completions(fx).at(0).status.message().find("outside max_group_size"),
              std::string::npos);
    fx = a.handle(SyncAfterFailureCmd{1ms, 5, false, {1, 0}});
    EXPECT_NE(completions(fx).at(0).status.message().find("failed_ranks_hint has 2"),
              std::string::npos);
}

TEST(MemberAgentTest, RegistrationTimesOutWithoutACoordinator) {
    auto a = std::move(MemberAgent::create(agentConfig(0, 2, false, 5)).value());
    a.handle(RegisterCmd{0ms, 1, "ep"});
    EXPECT_EQ(a.nextDeadline(), Millis(5000));
    auto fx = a.handle(Tick{5000ms});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_EQ(completions(fx)[0].status.code(), StatusCode::kTimeout);
    // A rejection completes it with the Coordinator's reason.
    a.handle(RegisterCmd{5000ms, 2, "ep"});
    fx = a.handle(Received{5001ms, fromCoordinator(RegisterReply{5, false, 0, "busy"}, 0)});
    EXPECT_NE(completions(fx).at(0).status.message().find("busy"), std::string::npos);
    // A reply meant for another process is ignored.
    a.handle(RegisterCmd{5001ms, 3, "ep"});
    fx = a.handle(Received{5002ms, fromCoordinator(RegisterReply{6, true, 1, ""}, 0)});
    EXPECT_TRUE(completions(fx).empty());
    EXPECT_FALSE(a.registered());
}

TEST(MemberAgentTest, FounderRegistrationCompletesAtBootstrap) {
    auto a = std::move(MemberAgent::create(agentConfig(1, 2, false, 5)).value());
    a.handle(RegisterCmd{0ms, 1, "ep"});
    auto fx = a.handle(Received{0ms, fromCoordinator(RegisterReply{5, true, 1, ""}, 0)});
    EXPECT_TRUE(completions(fx).empty());  // registered, but not bootstrapped
    EXPECT_TRUE(a.registered());
    ViewUpdate v{
        1,
        false,
        {{GMS::kNone, RankState::kSynced, 1, "a"}, {GMS::kNone, RankState::kSynced, 1, "ep"}}};
    fx = a.handle(Received{1ms, fromCoordinator(v, 0)});
    EXPECT_TRUE(completions(fx).empty());
    v.revision = 2;
    v.bootstrapped = true;
    v.slots[0].member = v.slots[1].member = GMS::kActive;
    fx = a.handle(Received{2ms, fromCoordinator(v, 1)});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_TRUE(completions(fx)[0].status.ok());
    EXPECT_EQ(completions(fx)[0].epoch, 1u);
    // Asking again once Active completes at once.
    fx = a.handle(RegisterCmd{3ms, 2, "ep"});
    EXPECT_TRUE(completions(fx).at(0).status.ok());
    EXPECT_TRUE(sentBodies<RegisterRequest>(fx).empty());
}

TEST(MemberAgentTest, SyncAfterFailureWaitsForTheWindowItWasGiven) {
    auto a = std::move(MemberAgent::create(agentConfig(0, 2, true, 5)).value());
    a.handle(RegisterCmd{0ms, 1, "ep"});
    a.handle(Received{0ms, fromCoordinator(RegisterReply{5, true, 1, ""}, 1)});

    auto fx = a.handle(SyncAfterFailureCmd{1000ms, 10, false, {0, 1}});
    auto ev = sentBodies<FailureEvidence>(fx);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_FALSE(ev[0].local_success);
    EXPECT_EQ(ev[0].failed_ranks_hint, (std::vector<uint8_t>{0, 1}));
    EXPECT_EQ(effectsOf<ProbeLinks>(fx).size(), 1u);  // report my observations too

    fx = a.handle(Received{1001ms, fromCoordinator(EvidenceAck{10, 4, 30000}, 1)});
    EXPECT_TRUE(completions(fx).empty());
    EXPECT_EQ(a.nextDeadline(), Millis(1001 + 30000 + 2000));
    fx = a.handle(Received{20000ms, fromCoordinator(ReconcileResult{3, {1, 1}, {}, false}, 1)});
    EXPECT_TRUE(completions(fx).empty());  // an older window
    fx = a.handle(Received{31001ms, fromCoordinator(ReconcileResult{4, {1, 0}, {1}, true}, 2)});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_EQ(completions(fx)[0].kind, OpKind::kSync);
    EXPECT_TRUE(completions(fx)[0].status.ok());

    // Nothing to wait for: completes on the ack.
    a.handle(SyncAfterFailureCmd{40000ms, 11, true, {}});
    fx = a.handle(Received{40001ms, fromCoordinator(EvidenceAck{11, 0, 0}, 2)});
    EXPECT_TRUE(completions(fx).at(0).status.ok());

    // A silent Coordinator: the sync times out instead of hanging.
    a.handle(SyncAfterFailureCmd{50000ms, 12, false, {}});
    fx = a.handle(Tick{52000ms});
    EXPECT_EQ(completions(fx).at(0).status.code(), StatusCode::kTimeout);
}

// The documented loop runs on every member: `while not all(get_peer_state(
// ranks)): ...; recover_ranks(ranks)`. A member whose mirror already shows
// another member's activation committed must leave the loop, not spin.
TEST(MemberAgentTest, PeerStateStaysReadyOnceTheTargetIsActive) {
    auto a = std::move(MemberAgent::create(agentConfig(0, 3, false, 5)).value());
    a.handle(RegisterCmd{0ms, 1, "ep"});
    a.handle(Received{0ms, fromCoordinator(RegisterReply{5, true, 1, ""}, 0)});
    ViewUpdate v{1,
                 true,
                 {{GMS::kActive, RankState::kHealthy, 1, "a"},
                  {GMS::kActive, RankState::kHealthy, 1, "b"},
                  {GMS::kAwaitingActivation, RankState::kHealthy, 1, "c"}}};
    a.handle(Received{0ms, fromCoordinator(v, 1)});
    EXPECT_EQ(a.peerState({2}), std::vector<bool>{true});
    // Rank 1's proposal committed first: rank 2 is Active in epoch 2.
    v.revision = 2;
    v.slots[2].member = GMS::kActive;
    a.handle(Received{0ms, fromCoordinator(v, 2)});
    EXPECT_EQ(a.peerState({2, 1, 0}), (std::vector<bool>{true, true, true}));
    // Its own proposal is then redundant and succeeds without a new epoch.
    auto fx = a.handle(ActivateRanksCmd{0ms, 7, {2}, 0ms});
    ASSERT_EQ(sentBodies<ActivateProposal>(fx).size(), 1u);
    fx = a.handle(Received{0ms, fromCoordinator(ProposalResult{7, StatusCode::kOk, ""}, 2)});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_TRUE(completions(fx)[0].status.ok());
    // Left or inactive again: not ready.
    v.revision = 3;
    v.slots[2].member = GMS::kInactive;
    a.handle(Received{0ms, fromCoordinator(v, 3)});
    EXPECT_EQ(a.peerState({2}), std::vector<bool>{false});
}

// join_group succeeds only through an applied view showing this slot Active.
TEST(MemberAgentTest, JoinCompletesOnlyWithTheViewThatShowsItActive) {
    auto a = std::move(MemberAgent::create(agentConfig(1, 2, true, 5)).value());
    a.handle(RegisterCmd{0ms, 1, "ep"});
    a.handle(Received{0ms, fromCoordinator(RegisterReply{5, true, 1, ""}, 0)});
    ViewUpdate v{1,
                 true,
                 {{GMS::kActive, RankState::kHealthy, 1, "a"},
                  {GMS::kInactive, RankState::kHealthy, 1, "b"}}};
    a.handle(Received{0ms, fromCoordinator(v, 1)});
    a.handle(JoinGroupCmd{0ms, 2, 0ms});
    // A malformed "rejection" carrying OK must not complete the join.
    auto fx = a.handle(Received{0ms, fromCoordinator(JoinRejected{StatusCode::kOk, ""}, 1)});
    EXPECT_TRUE(completions(fx).empty());
    v.revision = 2;
    v.slots[1].member = GMS::kAwaitingActivation;
    fx = a.handle(Received{0ms, fromCoordinator(v, 1)});
    EXPECT_TRUE(completions(fx).empty());
    v.revision = 3;
    v.slots[1].member = GMS::kActive;
    fx = a.handle(Received{0ms, fromCoordinator(v, 2)});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_TRUE(completions(fx)[0].status.ok());
    // The ViewApplied that shows it Active comes first, so a host applying
    // effects in order has it before the caller resumes.
    size_t view_at = fx.size(), done_at = fx.size();
    for (size_t i = 0; i < fx.size(); ++i) {
        if (std::holds_alternative<ViewApplied>(fx[i]))
            view_at = i;
        if (std::holds_alternative<OpCompleted>(fx[i]))
            done_at = i;
    }
    ASSERT_LT(view_at, done_at);
    EXPECT_EQ(std::get<ViewApplied>(fx[view_at]).self_state, GMS::kActive);
    EXPECT_EQ(a.activeRanks(), (std::vector<int32_t>{1, 1}));
}

TEST(MemberAgentTest, ProposalCompletesOnlyOnceTheCommittedViewArrived) {
    auto a = std::move(MemberAgent::create(agentConfig(0, 2, false, 5)).value());
    a.handle(RegisterCmd{0ms, 1, "ep"});
    a.handle(Received{0ms, fromCoordinator(RegisterReply{5, true, 1, ""}, 0)});
    ViewUpdate v{1,
                 true,
                 {{GMS::kActive, RankState::kHealthy, 1, "a"},
                  {GMS::kAwaitingActivation, RankState::kHealthy, 1, "b"}}};
    a.handle(Received{0ms, fromCoordinator(v, 1)});
    EXPECT_EQ(a.peerState({1}), std::vector<bool>{true});

    auto fx = a.handle(ActivateRanksCmd{0ms, 7, {1}, 0ms});
    auto props = sentBodies<ActivateProposal>(fx);
    ASSERT_EQ(props.size(), 1u);
    EXPECT_EQ(props[0].targets, (std::vector<RankRef>{RankRef{1, 1}}));
    // The result overtakes the view (it cannot with one FIFO link, but the
    // agent does not rely on it).
    fx = a.handle(Received{1ms, fromCoordinator(ProposalResult{7, StatusCode::kOk, ""}, 2)});
    EXPECT_TRUE(completions(fx).empty());
    v.revision = 2;
    v.slots[1].member = GMS::kActive;
    fx = a.handle(Received{2ms, fromCoordinator(v, 2)});
    ASSERT_EQ(completions(fx).size(), 1u);
    EXPECT_EQ(completions(fx)[0].epoch, 2u);
    EXPECT_EQ(a.groupSize(), 2);
    // Failures carry the Coordinator's code and reason.
    a.handle(DeactivateRanksCmd{3ms, 8, {1}});
    fx = a.handle(Received{4ms, fromCoordinator(ProposalResult{8, StatusCode::kInvalidArgument,
                                                               "proposal "
                                                               "failed: x"},
                                                2)});
    EXPECT_EQ(completions(fx).at(0).status.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mooncake::pg::control_plane::testing
