#include "mooncake-pg/control_plane/member_agent.h"

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <utility>

namespace mooncake::pg::control_plane {
namespace {

std::string ms(Millis d) {
    return std::to_string(d.count()) + " ms";
}

// A peer's identity and membership. When any of these change we probe again:
// a new process or endpoint needs new links, and a peer that starts waiting
// for activation is about to be judged by the links we report. Health is not
// part of it, since our own reports change health (that would loop).
using PeerKey = std::tuple<uint32_t, uint32_t, std::string, GroupMemberState>;

// Peers worth probing: a process sits there and told us where to find it.
std::vector<PeerKey> probeTargets(const GroupView& v, uint32_t self) {
    std::vector<PeerKey> peers;
    for (uint32_t r = 0; r < v.slots.size(); ++r) {
        const SlotInfo& s = v.slots[r];
        if (r == self || s.incarnation == 0 || s.endpoint.empty())
            continue;
        if (s.member == GroupMemberState::kLeft)
            continue;
        peers.emplace_back(r, s.incarnation, s.endpoint, s.member);
    }
    return peers;
}

}  // namespace

const char* opKindName(OpKind k) {
    switch (k) {
        case OpKind::kRegister:
            return "register";
        case OpKind::kJoin:
            return "join_group";
        case OpKind::kActivate:
            return "activate_ranks";
        case OpKind::kDeactivate:
            return "deactivate_ranks";
        case OpKind::kSync:
            return "sync_after_failure";
    }
    return "unknown";
}

Status validateMemberAgentConfig(const MemberAgentConfig& c) {
    if (c.group_id.empty() || c.group_id.size() > kMaxGroupIdBytes) {
        return InvalidArgument("MemberAgent: group id must be 1.." +
                               std::to_string(kMaxGroupIdBytes) + " bytes");
    }
    if (c.secret.size() > kMaxSecretBytes) {
        return InvalidArgument("MemberAgent: secret longer than " +
                               std::to_string(kMaxSecretBytes) + " bytes");
    }
    if (c.max_group_size == 0 || c.max_group_size > kMaxGroupSlots) {
        return InvalidArgument("MemberAgent: max_group_size must be 1.." +
                               std::to_string(kMaxGroupSlots) + ", got " +
                               std::to_string(c.max_group_size));
    }
    if (c.rank >= c.max_group_size) {
        return InvalidArgument("MemberAgent: rank " + std::to_string(c.rank) +
                               " is outside max_group_size " + std::to_string(c.max_group_size));
    }
    if (c.nonce == 0)
        return InvalidArgument("MemberAgent: nonce must be non-zero (random)");
    if (c.register_timeout.count() <= 0 || c.default_join_timeout.count() <= 0 ||
        c.default_proposal_timeout.count() <= 0 || c.reply_grace.count() < 0) {
        return InvalidArgument("MemberAgent: timeouts must be positive");
    }
    return validateFailureMode(c.mode);
}

Result<MemberAgent> MemberAgent::create(MemberAgentConfig config) {
    MC_RETURN_IF_ERROR(validateMemberAgentConfig(config));
    return MemberAgent(std::move(config));
}

MemberAgent::MemberAgent(MemberAgentConfig config)
    : config_(std::move(config)), active_mask_(config_.max_group_size, 0) {
    view_.slots.resize(config_.max_group_size);
}

std::vector<AgentEffect> MemberAgent::handle(const AgentEvent& event) {
    now_ = std::max(now_, std::visit([](const auto& e) { return e.now; }, event));
    std::visit(
        [this](const auto& e) {
            using T = std::decay_t<decltype(e)>;
            if constexpr (std::is_same_v<T, Received>) {
                onMessage(e.message);
            } else if constexpr (std::is_same_v<T, RegisterCmd>) {
                doRegister(e);
            } else if constexpr (std::is_same_v<T, PublishEndpointCmd>) {
                doPublish(e);
            } else if constexpr (std::is_same_v<T, JoinGroupCmd>) {
                doJoin(e);
            } else if constexpr (std::is_same_v<T, ActivateRanksCmd>) {
                doPropose(e.request_id, OpKind::kActivate, e.ranks, e.timeout);
            } else if constexpr (std::is_same_v<T, DeactivateRanksCmd>) {
                doPropose(e.request_id, OpKind::kDeactivate, e.ranks, Millis{0});
            } else if constexpr (std::is_same_v<T, SyncAfterFailureCmd>) {
                doSync(e);
            } else if constexpr (std::is_same_v<T, LinksProbedCmd>) {
                doLinksProbed(e);
            } else if constexpr (std::is_same_v<T, LeaveCmd>) {
                doLeave();
            }
        },
        event);
    expire();
    std::vector<AgentEffect> out;
    out.swap(out_);
    return out;
}

std::vector<AgentEffect> MemberAgent::handleBytes(Millis now, std::string_view bytes) {
    return handleMessageBytes(*this, now, bytes);
}

std::optional<Millis> MemberAgent::nextDeadline() const {
    std::optional<Millis> next;
    for (const auto& [id, op] : ops_) {
        if (!next || op.deadline < *next)
            next = op.deadline;
    }
    return next;
}

std::vector<bool> MemberAgent::peerState(const std::vector<uint32_t>& ranks) const {
    std::vector<bool> ready;
    ready.reserve(ranks.size());
    for (uint32_t r : ranks) {
        if (r >= view_.slots.size()) {
            ready.push_back(false);
            continue;
        }
        const SlotInfo& s = view_.slots[r];
        const bool awaiting = s.member == GroupMemberState::kAwaitingActivation &&
                              s.rank == RankState::kHealthy && !s.endpoint.empty();
        ready.push_back(awaiting || s.member == GroupMemberState::kActive);
    }
    return ready;
}

int MemberAgent::numSyncedRanks() const {
    int n = 0;
    for (const SlotInfo& s : view_.slots) {
        if (s.incarnation != 0 && s.rank != RankState::kOffline && !s.endpoint.empty() &&
            s.member != GroupMemberState::kLeft) {
            ++n;
        }
    }
    return n;
}

GroupMemberState MemberAgent::selfState() const {
    if (incarnation_ == 0)
        return GroupMemberState::kNone;
    const SlotInfo& s = view_.slots[config_.rank];
    if (s.incarnation > incarnation_)
        return GroupMemberState::kLeft;
    if (s.incarnation < incarnation_) {
        // The view announcing our registration has not arrived yet.
        return config_.is_extension ? GroupMemberState::kInactive : GroupMemberState::kNone;
    }
    return s.member;
}

// ---- incoming --------------------------------------------------------------

void MemberAgent::onMessage(const ControlMessage& m) {
    const MessageType type = messageType(m);
    const std::string what = std::string("dropped ") + messageTypeName(type) + ": ";
    if (m.header.group_id != config_.group_id) {
        return log(LogLevel::kWarn,
                   what + "group id '" + m.header.group_id + "' is not '" + config_.group_id + "'");
    }
    if (m.header.secret != config_.secret) {
        return log(LogLevel::kWarn, what + "group secret does not match");
    }
    if (m.header.sender_rank != kCoordinatorSender) {
        return log(LogLevel::kWarn, what + "not sent by the Coordinator");
    }
    std::visit(
        [&](const auto& b) {
            using T = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<T, ViewUpdate>) {
                onView(m, b);
            } else if constexpr (std::is_same_v<T, RegisterReply>) {
                onRegisterReply(b);
            } else if constexpr (std::is_same_v<T, ProposalResult>) {
                onProposalResult(m, b);
            } else if constexpr (std::is_same_v<T, EvidenceAck>) {
                onEvidenceAck(b);
            } else if constexpr (std::is_same_v<T, ReconcileStart>) {
                open_reconcile_ = b.reconcile_id;
                probe(b.reconcile_id);
            } else if constexpr (std::is_same_v<T, ReconcileResult>) {
                onReconcileResult(b);
            } else if constexpr (std::is_same_v<T, JoinRejected>) {
                onJoinRejected(b);
            } else {
                log(LogLevel::kWarn, what + "the Coordinator does not send this message type");
            }
        },
        m.body);
}

void MemberAgent::onView(const ControlMessage& m, const ViewUpdate& v) {
    if (v.slots.size() != config_.max_group_size) {
        return log(LogLevel::kWarn, "dropped ViewUpdate with " + std::to_string(v.slots.size()) +
                                        " slots, expected " +
                                        std::to_string(config_.max_group_size));
    }
    // Views are totally ordered by revision; the epoch never goes back.
    if (v.revision <= view_.revision || m.header.view_epoch < view_.epoch)
        return;

    const auto old_peers = probeTargets(view_, config_.rank);
    const bool epoch_changed = m.header.view_epoch != view_.epoch;
    view_.epoch = m.header.view_epoch;
    view_.revision = v.revision;
    view_.bootstrapped = v.bootstrapped;
    view_.slots = v.slots;
    active_mask_ = view_.activeMask();

    ViewApplied applied;
    applied.epoch = view_.epoch;
    applied.revision = view_.revision;
    applied.active_mask = active_mask_;
    applied.group_size = groupSizeFromMask(active_mask_);
    applied.self_state = selfState();
    applied.active_set_changed = epoch_changed;
    out_.emplace_back(std::in_place_type<ViewApplied>, std::move(applied));

    const GroupMemberState self = selfState();
    if (self == GroupMemberState::kLeft) {
        log(LogLevel::kError, "rank " + std::to_string(config_.rank) +
                                  " was taken over by incarnation " +
                                  std::to_string(view_.slots[config_.rank].incarnation) +
                                  "; this process (incarnation " + std::to_string(incarnation_) +
                                  ") is no longer part of the group");
    }
    completeRegistrationsIfReady();
    std::vector<std::pair<uint64_t, Status>> done;
    for (auto& [id, op] : ops_) {
        if (op.kind == OpKind::kJoin && self == GroupMemberState::kActive) {
            done.emplace_back(id, Status::OK());
        } else if (op.kind == OpKind::kJoin && self == GroupMemberState::kLeft) {
            done.emplace_back(id, Aborted("join_group: another process took over this rank"));
        } else if (op.wait_epoch != 0 && view_.epoch >= op.wait_epoch) {
            done.emplace_back(id, Status::OK());
        }
    }
    for (auto& [id, st] : done)
        complete(id, std::move(st));

    if (incarnation_ != 0 && (epoch_changed || old_peers != probeTargets(view_, config_.rank))) {
        probe(open_reconcile_);
    }
}

void MemberAgent::onRegisterReply(const RegisterReply& b) {
    if (b.nonce != config_.nonce) {
        return log(LogLevel::kWarn, "dropped RegisterReply for another process (nonce mismatch)");
    }
    if (!b.accepted) {
        failRegistrations(Unavailable("registration rejected by the Coordinator: " + b.reason));
        return;
    }
    if (incarnation_ == 0) {
        incarnation_ = b.incarnation;
        log(LogLevel::kInfo, "registered as rank " + std::to_string(config_.rank) +
                                 " incarnation " + std::to_string(incarnation_));
        // PublishEndpointCmd while the registration was in flight.
        if (endpoint_ != registered_endpoint_)
            send(PublishEndpoint{endpoint_});
        probe(open_reconcile_);
    }
    completeRegistrationsIfReady();
}

void MemberAgent::failRegistrations(const Status& st) {
    std::vector<uint64_t> ids;
    for (const auto& [id, op] : ops_) {
        if (op.kind == OpKind::kRegister)
            ids.push_back(id);
    }
    for (uint64_t id : ids)
        complete(id, st);
}

void MemberAgent::completeRegistrationsIfReady() {
    // An extension may start once it holds its slot; a founder only once the
    // group bootstrapped (what init_process_group waits for).
    if (incarnation_ == 0)
        return;
    if (!config_.is_extension && selfState() == GroupMemberState::kNone)
        return;
    failRegistrations(Status::OK());
}

void MemberAgent::onProposalResult(const ControlMessage& m, const ProposalResult& b) {
    auto it = ops_.find(b.request_id);
    if (it == ops_.end() ||
        (it->second.kind != OpKind::kActivate && it->second.kind != OpKind::kDeactivate)) {
        return log(LogLevel::kDebug,
                   "ignored ProposalResult for unknown request " + std::to_string(b.request_id));
    }
    if (b.code != StatusCode::kOk)
        return complete(b.request_id, Status(b.code, b.reason));
    if (m.header.view_epoch > view_.epoch) {
        // Complete only once get_active_ranks shows the committed view.
        it->second.wait_epoch = m.header.view_epoch;
        return;
    }
    complete(b.request_id, Status::OK());
}

void MemberAgent::onEvidenceAck(const EvidenceAck& b) {
    auto it = ops_.find(b.request_id);
    if (it == ops_.end() || it->second.kind != OpKind::kSync)
        return;
    if (b.reconcile_id == 0 || b.reconcile_id <= last_result_) {
        return complete(b.request_id, Status::OK());
    }
    it->second.acked = true;
    it->second.wait_reconcile = b.reconcile_id;
    it->second.deadline = now_ + Millis(b.window_remaining_ms) + config_.reply_grace;
}

void MemberAgent::onReconcileResult(const ReconcileResult& b) {
    last_result_ = std::max(last_result_, b.reconcile_id);
    if (open_reconcile_ != 0 && open_reconcile_ <= b.reconcile_id)
        open_reconcile_ = 0;
    std::vector<uint64_t> ids;
    for (const auto& [id, op] : ops_) {
        if (op.kind == OpKind::kSync && op.acked && op.wait_reconcile <= b.reconcile_id) {
            ids.push_back(id);
        }
    }
    for (uint64_t id : ids)
        complete(id, Status::OK());
}

void MemberAgent::onJoinRejected(const JoinRejected& b) {
    // A join succeeds only through the applied view that shows this slot
    // Active (onView); a "rejection" carrying OK proves nothing locally.
    if (b.code == StatusCode::kOk) {
        return log(LogLevel::kWarn, "dropped JoinRejected without an error code");
    }
    std::vector<uint64_t> ids;
    for (const auto& [id, op] : ops_) {
        if (op.kind == OpKind::kJoin)
            ids.push_back(id);
    }
    for (uint64_t id : ids)
        complete(id, Status(b.code, b.reason));
}

// ---- helpers ---------------------------------------------------------------

void MemberAgent::expire() {
    std::vector<std::pair<uint64_t, Status>> done;
    for (const auto& [id, op] : ops_) {
        if (now_ < op.deadline)
            continue;
        std::string why;
        switch (op.kind) {
            case OpKind::kRegister:
                why = incarnation_ == 0
                          ? "no RegisterReply from the Coordinator within " +
                                ms(config_.register_timeout)
                          : "the group did not bootstrap within " + ms(config_.register_timeout) +
                                " (not every founding rank registered)";
                break;
            case OpKind::kJoin:
                why =
                    "join_group timed out: not activated and no answer from the Coordinator "
                    "(is any online member calling activate_ranks/recover_ranks?)";
                break;
            case OpKind::kActivate:
            case OpKind::kDeactivate:
                why = op.wait_epoch != 0
                          ? std::string(opKindName(op.kind)) + " committed epoch " +
                                std::to_string(op.wait_epoch) + " but that view never arrived"
                          : std::string(opKindName(op.kind)) +
                                ": no ProposalResult from the Coordinator";
                break;
            case OpKind::kSync:
                why = op.acked ? "sync_after_failure: reconciliation #" +
                                     std::to_string(op.wait_reconcile) + " reported no result"
                               : "sync_after_failure: the Coordinator did not acknowledge the "
                                 "evidence";
                break;
        }
        done.emplace_back(id, Timeout(why));
    }
    for (auto& [id, st] : done)
        complete(id, std::move(st));
}

void MemberAgent::complete(uint64_t request_id, Status status) {
    auto it = ops_.find(request_id);
    if (it == ops_.end())
        return;
    out_.push_back(OpCompleted{request_id, it->second.kind, std::move(status), view_.epoch});
    ops_.erase(it);
}

void MemberAgent::probe(uint64_t reconcile_id) {
    ProbeLinks p;
    p.reconcile_id = reconcile_id;
    for (auto& [rank, inc, endpoint, member] : probeTargets(view_, config_.rank)) {
        p.peers.push_back(PeerToProbe{rank, inc, endpoint});
    }
    out_.emplace_back(std::in_place_type<ProbeLinks>, std::move(p));
}

void MemberAgent::send(MessageBody body) {
    send(std::move(body), view_.epoch);
}

void MemberAgent::send(MessageBody body, uint64_t view_epoch) {
    ControlMessage m;
    m.header.group_id = config_.group_id;
    m.header.sender_rank = config_.rank;
    m.header.sender_incarnation = incarnation_;
    m.header.view_epoch = view_epoch;
    m.header.secret = config_.secret;
    m.body = std::move(body);
    out_.push_back(SendToCoordinator{std::move(m)});
}

}  // namespace mooncake::pg::control_plane
