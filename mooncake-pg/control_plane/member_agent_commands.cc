// MemberAgent: the torch layer's calls, turned into messages and pending
// operations.
#include <algorithm>
#include <string>
#include <utility>

#include "mooncake-pg/control_plane/member_agent.h"

namespace mooncake::pg::control_plane {
namespace {

uint32_t toWireMs(Millis d) {
    if (d.count() <= 0)
        return 0;
    if (d.count() > UINT32_MAX)
        return UINT32_MAX;
    return static_cast<uint32_t>(d.count());
}

}  // namespace

// ---- commands --------------------------------------------------------------

bool MemberAgent::reject(uint64_t request_id, OpKind kind, Status status) {
    out_.push_back(OpCompleted{request_id, kind, std::move(status), view_.epoch});
    return false;
}

void MemberAgent::doRegister(const RegisterCmd& c) {
    if (ops_.count(c.request_id)) {
        reject(c.request_id, OpKind::kRegister, InvalidArgument("request id already in use"));
        return;
    }
    if (incarnation_ != 0) {  // already registered: maybe still waiting for bootstrap
        ops_[c.request_id] = PendingOp{OpKind::kRegister, now_ + config_.register_timeout};
        completeRegistrationsIfReady();
        return;
    }
    if (c.endpoint.size() > kMaxEndpointBytes) {
        reject(c.request_id, OpKind::kRegister,
               InvalidArgument("endpoint longer than " + std::to_string(kMaxEndpointBytes)));
        return;
    }
    endpoint_ = c.endpoint;
    registered_endpoint_ = c.endpoint;
    ops_[c.request_id] = PendingOp{OpKind::kRegister, now_ + config_.register_timeout};
    send(RegisterRequest{config_.nonce, config_.is_extension, c.endpoint});
}

void MemberAgent::doPublish(const PublishEndpointCmd& c) {
    if (c.endpoint.size() > kMaxEndpointBytes) {
        return log(LogLevel::kError, "endpoint longer than " + std::to_string(kMaxEndpointBytes));
    }
    endpoint_ = c.endpoint;
    // Before registration completes the reply handler publishes it.
    if (incarnation_ != 0)
        send(PublishEndpoint{c.endpoint});
}

void MemberAgent::doJoin(const JoinGroupCmd& c) {
    if (ops_.count(c.request_id)) {
        reject(c.request_id, OpKind::kJoin, InvalidArgument("request id already in use"));
        return;
    }
    if (incarnation_ == 0) {
        reject(c.request_id, OpKind::kJoin,
               InvalidArgument("join_group called before this process registered with the "
                               "Coordinator"));
        return;
    }
    switch (selfState()) {
        case GroupMemberState::kActive:
            reject(c.request_id, OpKind::kJoin, Status::OK());
            return;
        case GroupMemberState::kInactive:
        case GroupMemberState::kAwaitingActivation:
            break;
        case GroupMemberState::kLeft:
            reject(c.request_id, OpKind::kJoin,
                   Aborted("join_group: another process took over this rank"));
            return;
        default:
            reject(c.request_id, OpKind::kJoin,
                   InvalidArgument("join_group: founding members become Active at bootstrap; "
                                   "only processes created with is_extension=True (or "
                                   "deactivated ones) join"));
            return;
    }
    const Millis timeout = c.timeout.count() > 0 ? c.timeout : config_.default_join_timeout;
    ops_[c.request_id] = PendingOp{OpKind::kJoin, now_ + timeout + config_.reply_grace};
    send(JoinRequest{toWireMs(timeout)});
}

void MemberAgent::doPropose(uint64_t request_id, OpKind kind, const std::vector<uint32_t>& ranks,
                            Millis timeout) {
    const char* name = opKindName(kind);
    if (ops_.count(request_id)) {
        reject(request_id, kind, InvalidArgument("request id already in use"));
        return;
    }
    if (incarnation_ == 0) {
        reject(request_id, kind,
               InvalidArgument(std::string(name) + " called before this process registered"));
        return;
    }
    if (ranks.empty()) {
        reject(request_id, kind, InvalidArgument(std::string(name) + " needs at least one rank"));
        return;
    }
    std::vector<RankRef> refs;
    for (uint32_t r : ranks) {
        if (r >= config_.max_group_size) {
            reject(request_id, kind,
                   InvalidArgument(std::string(name) + ": rank " + std::to_string(r) +
                                   " is outside max_group_size " +
                                   std::to_string(config_.max_group_size)));
            return;
        }
        // Pin the process we saw, so the decision is not applied to a
        // replacement that registers in between.
        refs.push_back(RankRef{r, view_.slots[r].incarnation});
    }
    if (selfState() != GroupMemberState::kActive) {
        reject(request_id, kind,
               InvalidArgument(std::string(name) + " must be called on an Active member; rank " +
                               std::to_string(config_.rank) + " is " +
                               groupMemberStateName(selfState())));
        return;
    }
    const Millis t = timeout.count() > 0 ? timeout : config_.default_proposal_timeout;
    ops_[request_id] = PendingOp{kind, now_ + t + config_.reply_grace};
    if (kind == OpKind::kActivate) {
        send(ActivateProposal{request_id, std::move(refs), toWireMs(t)});
    } else {
        send(DeactivateProposal{request_id, std::move(refs)});
    }
}

void MemberAgent::doSync(const SyncAfterFailureCmd& c) {
    if (ops_.count(c.request_id)) {
        reject(c.request_id, OpKind::kSync, InvalidArgument("request id already in use"));
        return;
    }
    if (incarnation_ == 0) {
        reject(c.request_id, OpKind::kSync,
               InvalidArgument("sync_after_failure called before this process registered"));
        return;
    }
    if (!c.failed_ranks_hint.empty() && c.failed_ranks_hint.size() != config_.max_group_size) {
        reject(c.request_id, OpKind::kSync,
               InvalidArgument(
                   "failed_ranks_hint has " + std::to_string(c.failed_ranks_hint.size()) +
                   " entries, expected max_group_size " + std::to_string(config_.max_group_size)));
        return;
    }
    FailureEvidence ev;
    ev.request_id = c.request_id;
    ev.local_success = c.local_success;
    ev.failed_ranks_hint.reserve(c.failed_ranks_hint.size());
    for (uint8_t b : c.failed_ranks_hint)
        ev.failed_ranks_hint.push_back(b ? 1 : 0);
    ops_[c.request_id] = PendingOp{OpKind::kSync, now_ + config_.reply_grace};
    // The data plane never runs ahead of the applied view.
    const uint64_t epoch =
        c.observed_epoch != 0 ? std::min(c.observed_epoch, view_.epoch) : view_.epoch;
    send(std::move(ev), epoch);
    // "Report my observations": fresh links follow the evidence.
    probe(open_reconcile_);
}

void MemberAgent::doLinksProbed(const LinksProbedCmd& c) {
    if (incarnation_ == 0)
        return log(LogLevel::kDebug, "link probe result before registration");
    if (c.reached.size() != config_.max_group_size) {
        return log(LogLevel::kError, "link probe result has " + std::to_string(c.reached.size()) +
                                         " entries, expected " +
                                         std::to_string(config_.max_group_size));
    }
    send(LinkReport{open_reconcile_, c.reached});
}

void MemberAgent::doLeave() {
    if (incarnation_ != 0)
        send(Leave{});
    std::vector<uint64_t> ids;
    for (const auto& [id, op] : ops_)
        ids.push_back(id);
    for (uint64_t id : ids)
        complete(id, Aborted("this process left the group"));
    incarnation_ = 0;
}

}  // namespace mooncake::pg::control_plane
