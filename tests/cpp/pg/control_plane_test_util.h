// Helpers for the control-plane tests: building member messages, picking
// effects out of a handle() result (control_plane_cluster.h adds the member
// agents' side).
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "mooncake-pg/control_plane/coordinator.h"
#include "mooncake-pg/control_plane/member_agent.h"

namespace mooncake::pg::control_plane::testing {

using namespace std::chrono_literals;

inline constexpr const char* kGroup = "g0";
inline constexpr const char* kSecret = "s3cret";

template <typename T, typename Variant>
std::vector<T> effectsOf(const std::vector<Variant>& effects) {
    std::vector<T> out;
    for (const auto& e : effects) {
        if (const T* t = std::get_if<T>(&e))
            out.push_back(*t);
    }
    return out;
}

// Bodies of type B sent to `rank` (directly or by broadcast).
template <typename B>
std::vector<B> sentTo(const std::vector<CoordinatorEffect>& effects, uint32_t rank) {
    std::vector<B> out;
    for (const auto& e : effects) {
        const ControlMessage* m = nullptr;
        if (const auto* s = std::get_if<SendTo>(&e); s && s->rank == rank)
            m = &s->message;
        if (const auto* b = std::get_if<Broadcast>(&e)) {
            for (uint32_t r : b->ranks) {
                if (r == rank)
                    m = &b->message;
            }
        }
        if (m == nullptr)
            continue;
        if (const B* body = std::get_if<B>(&m->body))
            out.push_back(*body);
    }
    return out;
}

inline bool logContains(const std::vector<CoordinatorEffect>& effects, const std::string& text) {
    for (const Log& l : effectsOf<Log>(effects)) {
        if (l.text.find(text) != std::string::npos)
            return true;
    }
    return false;
}

inline CoordinatorConfig coordinatorConfig(uint32_t max_group_size, uint32_t founding_size,
                                           FailureMode mode = {}) {
    CoordinatorConfig c;
    c.group_id = kGroup;
    c.secret = kSecret;
    c.max_group_size = max_group_size;
    c.founding_size = founding_size;
    c.mode = mode;
    c.reconcile_window = 30s;
    c.default_proposal_timeout = 10s;
    c.default_join_timeout = 60s;
    return c;
}

// Drives a Coordinator directly, playing every member by hand.
class CoordinatorDriver {
public:
    explicit CoordinatorDriver(CoordinatorConfig config)
        : coord_(std::move(Coordinator::create(std::move(config)).value())),
          incarnation_(coord_.config().max_group_size, 0) {}

    Coordinator& coord() { return coord_; }
    const GroupView& view() const { return coord_.view(); }
    uint32_t incarnation(uint32_t rank) const { return incarnation_[rank]; }
    void setIncarnation(uint32_t rank, uint32_t inc) { incarnation_[rank] = inc; }
    Millis now() const { return now_; }

    ControlMessage message(uint32_t rank, MessageBody body) const {
        ControlMessage m;
        m.header.group_id = kGroup;
        m.header.sender_rank = rank;
        m.header.sender_incarnation = rank < incarnation_.size() ? incarnation_[rank] : 0;
        m.header.view_epoch = coord_.view().epoch;
        m.header.secret = kSecret;
        m.body = std::move(body);
        return m;
    }

    std::vector<CoordinatorEffect> deliver(const ControlMessage& m) {
        // Through the wire format, as the host would.
        auto parsed = parseControlMessage(serialize(m));
        EXPECT_TRUE(parsed.ok()) << parsed.status().toString();
        return coord_.handle(Received{now_, std::move(parsed).value()});
    }
    std::vector<CoordinatorEffect> send(uint32_t rank, MessageBody body) {
        return deliver(message(rank, std::move(body)));
    }
    std::vector<CoordinatorEffect> tickAt(Millis t) {
        now_ = t;
        return coord_.handle(Tick{now_});
    }

    // Registers and records the incarnation the Coordinator assigned.
    std::vector<CoordinatorEffect> registerRank(uint32_t rank, bool is_extension,
                                                std::string endpoint = "ep", uint64_t nonce = 0) {
        auto fx = send(rank, RegisterRequest{nonce ? nonce : 1000 + rank + 100 * ++registrations_,
                                             is_extension, std::move(endpoint)});
        for (const RegisterReply& r : sentTo<RegisterReply>(fx, rank)) {
            if (r.accepted)
                incarnation_[rank] = r.incarnation;
        }
        return fx;
    }
    void bootstrap() {
        for (uint32_t r = 0; r < coord_.config().founding_size; ++r)
            registerRank(r, false);
    }

    // `rank` reports reaching the current process of every rank in `peers`.
    std::vector<CoordinatorEffect> reportLinks(uint32_t rank, const std::vector<uint32_t>& peers) {
        LinkReport lr;
        lr.reached.assign(coord_.config().max_group_size, 0);
        for (uint32_t p : peers)
            lr.reached[p] = coord_.view().slots[p].incarnation;
        return send(rank, lr);
    }
    // Everyone in `ranks` reports reaching everyone else in `ranks`.
    void fullMesh(const std::vector<uint32_t>& ranks) {
        for (uint32_t r : ranks)
            reportLinks(r, ranks);
    }

    std::vector<CoordinatorEffect> activate(uint32_t proposer, std::vector<uint32_t> targets,
                                            uint64_t request_id = 1, uint32_t timeout_ms = 0) {
        ActivateProposal p;
        p.request_id = request_id;
        for (uint32_t t : targets)
            p.targets.push_back(RankRef{t, 0});
        p.timeout_ms = timeout_ms;
        return send(proposer, p);
    }
    std::vector<CoordinatorEffect> deactivate(uint32_t proposer, std::vector<uint32_t> targets,
                                              uint64_t request_id = 2) {
        DeactivateProposal p;
        p.request_id = request_id;
        for (uint32_t t : targets)
            p.targets.push_back(RankRef{t, 0});
        return send(proposer, p);
    }
    std::vector<CoordinatorEffect> evidence(uint32_t rank, std::vector<uint32_t> failed,
                                            bool local_success = false) {
        FailureEvidence ev;
        ev.request_id = 77;
        ev.local_success = local_success;
        if (!failed.empty()) {
            ev.failed_ranks_hint.assign(coord_.config().max_group_size, 0);
            for (uint32_t f : failed)
                ev.failed_ranks_hint[f] = 1;
        }
        return send(rank, ev);
    }

    // Registers `rank` as an extension with links to every active member
    // (and them to it) and calls join_group.
    void prepareJoiner(uint32_t rank, const std::vector<uint32_t>& extra_peers = {}) {
        registerRank(rank, true);
        std::vector<uint32_t> mesh = coord_.view().activeRanks();
        for (uint32_t p : extra_peers)
            mesh.push_back(p);
        mesh.push_back(rank);
        fullMesh(mesh);
        send(rank, JoinRequest{0});
    }

private:
    Coordinator coord_;
    std::vector<uint32_t> incarnation_;
    Millis now_{0};
    uint64_t registrations_ = 0;
};

inline std::vector<int32_t> mask(std::initializer_list<int32_t> v) {
    return v;
}

// A group with founders [0, founders) bootstrapped and fully connected.
inline CoordinatorDriver bootstrapped(uint32_t max = 8, uint32_t founders = 4,
                                      FailureMode mode = {}) {
    CoordinatorDriver d(coordinatorConfig(max, founders, mode));
    d.bootstrap();
    d.fullMesh(d.view().activeRanks());
    return d;
}

}  // namespace mooncake::pg::control_plane::testing
