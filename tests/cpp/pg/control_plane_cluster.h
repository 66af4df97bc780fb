// The member-agent side of the control-plane tests: an agent's config and
// coordinator messages, and a Cluster that wires a Coordinator to
// MemberAgents through the wire format with a scripted network, without
// sockets or threads.
#pragma once

#include <gtest/gtest.h>

#include <map>

#include "mooncake-pg/control_plane/member_agent.h"
#include "tests/cpp/pg/control_plane_test_util.h"

namespace mooncake::pg::control_plane::testing {

using GMS = GroupMemberState;

inline MemberAgentConfig agentConfig(uint32_t rank, uint32_t max, bool is_extension, uint64_t nonce,
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

inline ControlMessage fromCoordinator(MessageBody body, uint64_t epoch) {
    ControlMessage m;
    m.header.group_id = kGroup;
    m.header.sender_rank = kCoordinatorSender;
    m.header.view_epoch = epoch;
    m.header.secret = kSecret;
    m.body = std::move(body);
    return m;
}

inline std::vector<OpCompleted> completions(const std::vector<AgentEffect>& fx) {
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

}  // namespace mooncake::pg::control_plane::testing
