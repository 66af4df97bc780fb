// MemberAgent flows, alone and wired to a Coordinator through the wire
// format with a scripted network (the Cluster below), without sockets or
// threads.
#include <gtest/gtest.h>

#include <map>

#include "mooncake-pg/control_plane/member_agent.h"
#include "tests/cpp/pg/control_plane_test_util.h"

namespace mooncake::pg::control_plane::testing {
namespace {

using GMS = GroupMemberState;

MemberAgentConfig agentConfig(uint32_t rank, uint32_t max, bool is_extension, uint64_t nonce,
                              FailureMode mode = {}) {
    MemberAgentConfig c;
    c.group_id = kGroup;
    c.secret = kSecret;
    c.rank = rank;
    c.max_group_size = max;
    c.is_extension = is_extension;
    c.nonce = nonce;
    c.mode = mode;
    c.register_timeout = 5s;
    c.default_join_timeout = 60s;
    c.default_proposal_timeout = 10s;
    c.reply_grace = 2s;
    return c;
}

ControlMessage fromCoordinator(MessageBody body, uint64_t epoch) {
    ControlMessage m;
    m.header.group_id = kGroup;
    m.header.sender_rank = kCoordinatorSender;
    m.header.view_epoch = epoch;
    m.header.secret = kSecret;
    m.body = std::move(body);
    return m;
}

std::vector<OpCompleted> completions(const std::vector<AgentEffect>& fx) {
    return effectsOf<OpCompleted>(fx);
}

template <typename B>
std::vector<B> sentBodies(const std::vector<AgentEffect>& fx) {
    std::vector<B> out;
    for (const auto& s : effectsOf<SendToCoordinator>(fx)) {
        if (const B* b = std::get_if<B>(&s.message.body))
            out.push_back(*b);
    }
    return out;
}

// ---- a Coordinator and its members, connected by a scripted network -------

class Cluster {
public:
    Cluster(uint32_t max, uint32_t founders, FailureMode mode = {})
        : coord_(std::move(Coordinator::create(coordinatorConfig(max, founders, mode)).value())),
          max_(max),
          agents_(max),
          alive_(max, false),
          cut_(max, std::vector<bool>(max, false)),
          mode_(mode) {}

    MemberAgent& agent(uint32_t r) { return *agents_[r]; }
    const Coordinator& coord() const { return coord_; }
    Millis now() const { return now_; }
    std::vector<OpCompleted>& done() { return done_; }
    std::vector<CoordinatorEffect>& coordEffects() { return coord_fx_; }

    // Starts a process for slot `r` and registers it.
    void start(uint32_t r, bool is_extension) {
        agents_[r] = std::move(
            MemberAgent::create(agentConfig(r, max_, is_extension, ++nonces_ * 7919, mode_))
                .value());
        alive_[r] = true;
        act(r, RegisterCmd{now_, nextId(), "tcp://host" + std::to_string(r)});
    }
    void kill(uint32_t r) { alive_[r] = false; }
    void cut(uint32_t a, uint32_t b) { cut_[a][b] = cut_[b][a] = true; }

    // Runs a command on `r` and delivers everything that follows.
    void act(uint32_t r, AgentEvent e) {
        route(r, agents_[r]->handle(e));
        drain();
    }
    uint64_t nextId() { return ++request_ids_; }

    void advanceTo(Millis t) {
        now_ = t;
        routeCoord(coord_.handle(Tick{now_}));
        for (uint32_t r = 0; r < max_; ++r) {
            if (agents_[r] && alive_[r])
                route(r, agents_[r]->handle(Tick{now_}));
        }
        drain();
    }

    std::optional<OpCompleted> result(uint64_t id) const {
        for (const OpCompleted& c : done_) {
            if (c.request_id == id)
                return c;
        }
        return std::nullopt;
    }

private:
    struct Packet {
        bool to_coordinator = false;
        uint32_t rank = 0;
        std::string bytes;
    };

    void route(uint32_t r, std::vector<AgentEffect> fx) {
        for (auto& e : fx) {
            if (auto* s = std::get_if<SendToCoordinator>(&e)) {
                if (alive_[r])
                    queue_.push_back({true, r, serialize(s->message)});
            } else if (auto* p = std::get_if<ProbeLinks>(&e)) {
                probes_.push_back({r, std::move(*p)});
            } else if (auto* c = std::get_if<OpCompleted>(&e)) {
                done_.push_back(*c);
            }
        }
    }

    void routeCoord(std::vector<CoordinatorEffect> fx) {
        for (auto& e : fx) {
            if (auto* s = std::get_if<SendTo>(&e)) {
                uint32_t r = s->rank;
                // A RegisterReply belongs to the process with that nonce.
                if (auto* reply = std::get_if<RegisterReply>(&s->message.body)) {
                    if (!agents_[r] || agents_[r]->config().nonce != reply->nonce)
                        continue;
                }
                queue_.push_back({false, r, serialize(s->message)});
            } else if (auto* b = std::get_if<Broadcast>(&e)) {
                for (uint32_t r : b->ranks)
                    queue_.push_back({false, r, serialize(b->message)});
            }
            coord_fx_.push_back(std::move(e));
        }
    }

    void drain() {
        while (!queue_.empty() || !probes_.empty()) {
            while (!queue_.empty()) {
                Packet p = std::move(queue_.front());
                queue_.pop_front();
                if (p.to_coordinator) {
                    routeCoord(coord_.handleBytes(now_, p.bytes));
                } else if (agents_[p.rank] && alive_[p.rank]) {
                    route(p.rank, agents_[p.rank]->handleBytes(now_, p.bytes));
                }
            }
            // Probes run after the messages in flight were delivered.
            auto probes = std::move(probes_);
            probes_.clear();
            for (auto& [r, probe] : probes) {
                if (!alive_[r])
                    continue;
                // A peer answers with the incarnation it knows it has.
                LinksProbedCmd cmd{now_, std::vector<uint32_t>(max_, 0)};
                for (const PeerToProbe& peer : probe.peers) {
                    const auto& other = agents_[peer.rank];
                    if (alive_[peer.rank] && !cut_[r][peer.rank] && other &&
                        other->incarnation() == peer.incarnation) {
                        cmd.reached[peer.rank] = peer.incarnation;
                    }
                }
                route(r, agents_[r]->handle(cmd));
            }
        }
    }

    Coordinator coord_;
    uint32_t max_;
    std::vector<std::optional<MemberAgent>> agents_;
    std::vector<bool> alive_;
    std::vector<std::vector<bool>> cut_;
    FailureMode mode_;
    std::deque<Packet> queue_;
    std::vector<std::pair<uint32_t, ProbeLinks>> probes_;
    std::vector<OpCompleted> done_;
    std::vector<CoordinatorEffect> coord_fx_;
    Millis now_{0};
    uint64_t nonces_ = 0;
    uint64_t request_ids_ = 0;
};

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
