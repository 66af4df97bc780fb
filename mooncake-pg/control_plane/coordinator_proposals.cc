// Activation and deactivation proposals.
#include <algorithm>
#include <set>

#include "mooncake-pg/control_plane/coordinator.h"

namespace mooncake::pg::control_plane {
namespace {

std::string rankStr(uint32_t r) {
    return "rank " + std::to_string(r);
}

// Keeps the first mention of each rank.
std::vector<RankRef> dedupe(const std::vector<RankRef>& refs) {
    std::vector<RankRef> out;
    std::set<uint32_t> seen;
    for (const RankRef& r : refs) {
        if (seen.insert(r.rank).second)
            out.push_back(r);
    }
    return out;
}

// What makes a proposal of `call` invalid whatever the group's state, or ""
// when nothing does: only an Active member may propose, naming at least one
// rank, each inside max_group_size. `proposer_calls` names the user calls a
// proposer may have made.
std::string proposalError(const GroupView& view, uint32_t max_group_size, uint32_t proposer,
                          const std::vector<RankRef>& targets, const char* call,
                          const char* proposer_calls) {
    if (!view.isActive(proposer)) {
        return "proposer " + rankStr(proposer) + " is " +
               groupMemberStateName(view.slots[proposer].member) +
               "; only an Active member can propose " + proposer_calls;
    }
    if (targets.empty())
        return std::string(call) + " got no ranks";
    for (const RankRef& t : targets) {
        if (t.rank >= max_group_size) {
            return rankStr(t.rank) + " is outside max_group_size " + std::to_string(max_group_size);
        }
    }
    return "";
}

}  // namespace

void Coordinator::finishProposal(uint32_t proposer, uint64_t request_id, StatusCode code,
                                 const std::string& reason) {
    send(proposer, ProposalResult{request_id, code, reason});
    if (code != StatusCode::kOk) {
        log(LogLevel::kWarn,
            rankStr(proposer) + " request " + std::to_string(request_id) + ": " + reason);
        out_.push_back(ProposalFailed{proposer, request_id, reason});
    }
}

void Coordinator::onActivate(const MessageHeader& h, const ActivateProposal& b) {
    const uint32_t p = h.sender_rank;
    auto failNow = [&](const std::string& why) {
        finishProposal(p, b.request_id, StatusCode::kInvalidArgument, "proposal failed: " + why);
    };
    const std::string invalid = proposalError(view_, config_.max_group_size, p, b.targets,
                                              "activate_ranks", "activate_ranks/recover_ranks");
    if (!invalid.empty())
        return failNow(invalid);
    for (const PendingActivation& q : pending_) {
        if (q.proposer == p && q.proposer_incarnation == h.sender_incarnation &&
            q.request_id == b.request_id) {
            return;  // a retransmission of a proposal we already hold
        }
    }
    PendingActivation q;
    q.proposer = p;
    q.proposer_incarnation = h.sender_incarnation;
    q.request_id = b.request_id;
    q.targets = dedupe(b.targets);
    q.deadline = now_ + (b.timeout_ms ? Millis(b.timeout_ms) : config_.default_proposal_timeout);
    pending_.push_back(std::move(q));
}

std::string Coordinator::activationBlocker(const std::vector<RankRef>& targets) const {
    if (!view_.bootstrapped) {
        uint32_t have = 0;
        for (uint32_t r = 0; r < config_.founding_size; ++r)
            have += slots_[r].registered ? 1 : 0;
        return "the group is not ready: bootstrap has not completed (" + std::to_string(have) +
               " of " + std::to_string(config_.founding_size) + " founding members registered)";
    }
    if (window_) {
        return "the group is not ready: failure reconciliation #" + std::to_string(window_->id) +
               " is in progress";
    }
    for (const RankRef& t : targets) {
        const SlotInfo& info = view_.slots[t.rank];
        if (t.incarnation != 0 && t.incarnation != info.incarnation) {
            return rankStr(t.rank) +
                   " was replaced after the proposal was made (proposed "
                   "incarnation " +
                   std::to_string(t.incarnation) + ", now " + std::to_string(info.incarnation) +
                   ")";
        }
        if (info.member != GroupMemberState::kAwaitingActivation) {
            return rankStr(t.rank) + " is " + groupMemberStateName(info.member) +
                   ", expected AwaitingActivation (its process must register with "
                   "is_extension=True and call join_group)";
        }
        if (info.rank != RankState::kHealthy) {
            return rankStr(t.rank) + " is " + rankStateName(info.rank) +
                   ", expected Healthy (it has not shown bidirectional links to every active "
                   "member)";
        }
        if (info.endpoint.empty())
            return rankStr(t.rank) + " has not published an endpoint";
    }
    std::vector<uint32_t> set = view_.activeRanks();
    for (const RankRef& t : targets)
        set.push_back(t.rank);
    std::sort(set.begin(), set.end());
    for (size_t i = 0; i < set.size(); ++i) {
        for (size_t j = i + 1; j < set.size(); ++j) {
            const uint32_t a = set[i];
            const uint32_t b = set[j];
            if (bidirectional(a, b))
                continue;
            auto yn = [](bool v) { return v ? "yes" : "no"; };
            return "the resulting active set is not pairwise connected: ranks " +
                   std::to_string(a) + " and " + std::to_string(b) +
                   " are not bidirectionally "
                   "linked (" +
                   std::to_string(a) + "->" + std::to_string(b) + ": " +
                   yn(linked(slots_[a].links, b)) + ", " + std::to_string(b) + "->" +
                   std::to_string(a) + ": " + yn(linked(slots_[b].links, a)) + ")";
        }
    }
    return "";
}

void Coordinator::evaluateProposals() {
    // Proposals are checked in arrival order; a commit changes the state, so
    // the scan restarts and earlier blocked proposals are checked again.
    size_t i = 0;
    while (i < pending_.size()) {
        PendingActivation& q = pending_[i];
        const bool proposer_same = slots_[q.proposer].registered &&
                                   view_.slots[q.proposer].incarnation == q.proposer_incarnation;
        auto finish = [&](StatusCode code, const std::string& reason) {
            const bool ok = code == StatusCode::kOk;
            // A replaced proposer would not know the request id; just log.
            if (proposer_same) {
                finishProposal(q.proposer, q.request_id, code, reason);
            } else {
                log(LogLevel::kInfo, "proposal " + std::to_string(q.request_id) + " of " +
                                         rankStr(q.proposer) +
                                         " (gone): " + (ok ? "committed" : reason));
            }
            pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
        };

        if (q.evaluated_at != change_count_) {
            q.evaluated_at = change_count_;
            std::vector<RankRef> remaining;
            for (const RankRef& t : q.targets) {
                if (!view_.isActive(t.rank))
                    remaining.push_back(t);
            }
            if (remaining.empty()) {
                // Redundant proposals land here: the targets are already in.
                finish(StatusCode::kOk, "");
                continue;
            }
            std::string blocker = activationBlocker(remaining);
            if (blocker.empty()) {
                std::vector<uint32_t> activated;
                for (const RankRef& t : remaining) {
                    view_.slots[t.rank].member = GroupMemberState::kActive;
                    slots_[t.rank].join_deadline.reset();
                    slots_[t.rank].join_blocker.clear();
                    activated.push_back(t.rank);
                }
                // Commit first so the result carries the new epoch.
                commitActiveSet(activated, {}, "activate_ranks from " + rankStr(q.proposer));
                finish(StatusCode::kOk, "");
                i = 0;
                continue;
            }
            q.blocker = blocker;
            for (const RankRef& t : remaining)
                slots_[t.rank].join_blocker = blocker;
        }
        if (now_ >= q.deadline) {
            finish(StatusCode::kTimeout, "proposal failed: " + q.blocker);
            continue;
        }
        ++i;
    }
}

void Coordinator::onDeactivate(const MessageHeader& h, const DeactivateProposal& b) {
    const uint32_t p = h.sender_rank;
    auto failNow = [&](const std::string& why) {
        finishProposal(p, b.request_id, StatusCode::kInvalidArgument, "proposal failed: " + why);
    };
    const std::string invalid = proposalError(view_, config_.max_group_size, p, b.targets,
                                              "deactivate_ranks", "deactivate_ranks");
    if (!invalid.empty())
        return failNow(invalid);
    std::vector<uint32_t> deactivate;
    std::vector<uint32_t> unjoin;
    std::string skipped;
    for (const RankRef& t : dedupe(b.targets)) {
        const SlotInfo& info = view_.slots[t.rank];
        if (t.incarnation != 0 && t.incarnation != info.incarnation) {
            skipped += (skipped.empty() ? "" : "; ") + rankStr(t.rank) + " skipped: incarnation " +
                       std::to_string(t.incarnation) + " was replaced by " +
                       std::to_string(info.incarnation);
            continue;
        }
        if (info.member == GroupMemberState::kActive)
            deactivate.push_back(t.rank);
        if (info.member == GroupMemberState::kAwaitingActivation)
            unjoin.push_back(t.rank);
    }
    if (!deactivate.empty() && deactivate.size() == activeCount()) {
        return failNow("deactivate_ranks would leave the group with no Active member");
    }
    for (uint32_t r : unjoin) {
        view_.slots[r].member = GroupMemberState::kInactive;
        slots_[r].join_deadline.reset();
        std::string reason =
            rankStr(r) + " was deactivated by " + rankStr(p) + " before its activation committed";
        send(r, JoinRejected{StatusCode::kAborted, reason});
        out_.push_back(JoinFailed{r, reason});
        tableChanged();
    }
    for (uint32_t r : deactivate)
        view_.slots[r].member = GroupMemberState::kInactive;
    if (!deactivate.empty())
        commitActiveSet({}, deactivate, "deactivate_ranks from " + rankStr(p));
    finishProposal(p, b.request_id, StatusCode::kOk, skipped);
}

}  // namespace mooncake::pg::control_plane
