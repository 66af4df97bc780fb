#include "mooncake-pg/control_plane/coordinator.h"

#include <algorithm>
#include <type_traits>
#include <utility>

namespace mooncake::pg::control_plane {
namespace {

// Compares without an early exit so the time taken does not reveal how much
// of a guessed secret was right.
bool secretMatches(std::string_view got, std::string_view want) {
    unsigned diff = got.size() == want.size() ? 0u : 1u;
    for (size_t i = 0; i < got.size(); ++i) {
        diff |= static_cast<unsigned char>(got[i]) ^
                static_cast<unsigned char>(want.empty() ? 0 : want[i % want.size()]);
    }
    return diff == 0;
}

bool sentByMembers(MessageType t) {
    switch (t) {
        case MessageType::kRegisterRequest:
        case MessageType::kPublishEndpoint:
        case MessageType::kJoinRequest:
        case MessageType::kActivateProposal:
        case MessageType::kDeactivateProposal:
        case MessageType::kLinkReport:
        case MessageType::kFailureEvidence:
        case MessageType::kLeave:
            return true;
        default:
            return false;
    }
}

std::string rankStr(uint32_t r) {
    return "rank " + std::to_string(r);
}

}  // namespace

Status validateCoordinatorConfig(const CoordinatorConfig& c) {
    if (c.group_id.empty() || c.group_id.size() > kMaxGroupIdBytes) {
        return InvalidArgument("Coordinator: group id must be 1.." +
                               std::to_string(kMaxGroupIdBytes) + " bytes");
    }
    if (c.secret.size() > kMaxSecretBytes) {
        return InvalidArgument("Coordinator: secret longer than " +
                               std::to_string(kMaxSecretBytes) + " bytes");
    }
    if (c.max_group_size == 0 || c.max_group_size > kMaxGroupSlots) {
        return InvalidArgument("Coordinator: max_group_size must be 1.." +
                               std::to_string(kMaxGroupSlots) + ", got " +
                               std::to_string(c.max_group_size));
    }
    if (c.founding_size == 0 || c.founding_size > c.max_group_size) {
        return InvalidArgument("Coordinator: the initial group size (" +
                               std::to_string(c.founding_size) + ") must be 1..max_group_size (" +
                               std::to_string(c.max_group_size) + ")");
    }
    if (c.default_proposal_timeout.count() <= 0 || c.default_join_timeout.count() <= 0) {
        return InvalidArgument("Coordinator: default proposal and join timeouts must be positive");
    }
    MC_RETURN_IF_ERROR(validateFailureMode(c.mode));
    MC_RETURN_IF_ERROR(validateReconcileWindow(c.reconcile_window, c.collective_timeout));
    return Status::OK();
}

Result<Coordinator> Coordinator::create(CoordinatorConfig config) {
    MC_RETURN_IF_ERROR(validateCoordinatorConfig(config));
    return Coordinator(std::move(config));
}

Coordinator::Coordinator(CoordinatorConfig config)
    : config_(std::move(config)), slots_(config_.max_group_size) {
    view_.slots.resize(config_.max_group_size);
}

std::vector<CoordinatorEffect> Coordinator::handle(const CoordinatorEvent& event) {
    Millis t = std::visit([](const auto& e) { return e.now; }, event);
    // Deadlines must not move backwards if the host's time source does.
    now_ = std::max(now_, t);
    if (const auto* r = std::get_if<Received>(&event))
        onMessage(r->message);
    advance();
    std::vector<CoordinatorEffect> out;
    flush(&out);
    return out;
}

std::vector<CoordinatorEffect> Coordinator::handleBytes(Millis now, std::string_view bytes) {
    return handleMessageBytes(*this, now, bytes);
}

std::optional<Millis> Coordinator::nextDeadline() const {
    std::optional<Millis> next;
    auto consider = [&next](Millis t) {
        if (!next || t < *next)
            next = t;
    };
    if (window_)
        consider(window_->deadline);
    for (const PendingActivation& p : pending_)
        consider(p.deadline);
    for (size_t r = 0; r < slots_.size(); ++r) {
        if (view_.slots[r].member == GroupMemberState::kAwaitingActivation &&
            slots_[r].join_deadline) {
            consider(*slots_[r].join_deadline);
        }
    }
    return next;
}

bool Coordinator::admit(const ControlMessage& m) {
    const MessageHeader& h = m.header;
    const MessageType type = messageType(m);
    std::string what =
        std::string("dropped ") + messageTypeName(type) + " from " + rankStr(h.sender_rank) + ": ";
    if (h.group_id != config_.group_id) {
        log(LogLevel::kWarn,
            what + "group id '" + h.group_id + "' is not '" + config_.group_id + "'");
        return false;
    }
    if (!secretMatches(h.secret, config_.secret)) {
        log(LogLevel::kWarn, what + "group secret does not match");
        return false;
    }
    if (h.sender_rank >= config_.max_group_size) {
        log(LogLevel::kWarn, what + "sender is not a slot of this group (max_group_size " +
                                 std::to_string(config_.max_group_size) + ")");
        return false;
    }
    if (!sentByMembers(type)) {
        log(LogLevel::kWarn, what + "members do not send this message type");
        return false;
    }
    if (type == MessageType::kRegisterRequest)
        return true;
    const SlotState& s = slots_[h.sender_rank];
    if (!s.registered) {
        log(LogLevel::kInfo, what + "no registered process holds this slot");
        return false;
    }
    const uint32_t current = view_.slots[h.sender_rank].incarnation;
    if (h.sender_incarnation != current) {
        log(LogLevel::kInfo, what + "stale incarnation " + std::to_string(h.sender_incarnation) +
                                 " (the slot now holds incarnation " + std::to_string(current) +
                                 ")");
        return false;
    }
    return true;
}

void Coordinator::onMessage(const ControlMessage& m) {
    if (!admit(m))
        return;
    const MessageHeader& h = m.header;
    std::visit(
        [&](const auto& b) {
            using T = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<T, RegisterRequest>) {
                onRegister(h, b);
            } else if constexpr (std::is_same_v<T, PublishEndpoint>) {
                onPublishEndpoint(h.sender_rank, b);
            } else if constexpr (std::is_same_v<T, JoinRequest>) {
                onJoinRequest(h.sender_rank, b);
            } else if constexpr (std::is_same_v<T, ActivateProposal>) {
                onActivate(h, b);
            } else if constexpr (std::is_same_v<T, DeactivateProposal>) {
                onDeactivate(h, b);
            } else if constexpr (std::is_same_v<T, LinkReport>) {
                onLinkReport(h, b);
            } else if constexpr (std::is_same_v<T, FailureEvidence>) {
                onEvidence(h, b);
            } else if constexpr (std::is_same_v<T, Leave>) {
                onLeave(h.sender_rank);
            }
        },
        m.body);
}

void Coordinator::onRegister(const MessageHeader& h, const RegisterRequest& b) {
    const uint32_t r = h.sender_rank;
    SlotState& s = slots_[r];
    SlotInfo& info = view_.slots[r];
    auto reject = [&](const std::string& reason) {
        log(LogLevel::kWarn, "rejected registration for " + rankStr(r) + ": " + reason);
        send(r, RegisterReply{b.nonce, false, 0, reason});
    };

    if (s.registered && s.nonce == b.nonce) {
        // The same process again (a retransmission or reconnect): same answer.
        if (!b.endpoint.empty() && b.endpoint != info.endpoint) {
            info.endpoint = b.endpoint;
            tableChanged();
        }
        send(r, RegisterReply{b.nonce, true, info.incarnation, ""});
        sendViewTo(r);
        return;
    }
    if (!b.is_extension) {
        if (view_.bootstrapped) {
            return reject(
                "the group has already bootstrapped; a process that joins it later "
                "must set is_extension=True");
        }
        if (r >= config_.founding_size) {
            return reject(rankStr(r) + " is not a founding rank (initial group size " +
                          std::to_string(config_.founding_size) +
                          "); a process for a reserved slot must set is_extension=True");
        }
    } else {
        if (!view_.bootstrapped && r < config_.founding_size) {
            return reject(rankStr(r) +
                          " is reserved for a founding member until bootstrap "
                          "completes");
        }
        if (s.registered && (info.member == GroupMemberState::kActive ||
                             info.member == GroupMemberState::kAwaitingActivation)) {
            std::string held = rankStr(r) + " is held by " + groupMemberStateName(info.member) +
                               " incarnation " + std::to_string(info.incarnation);
            if (info.member == GroupMemberState::kActive) {
                // A launcher starts a replacement only after the old process
                // died, so this is evidence against the old incarnation.
                if (!window_) {
                    openWindow("a replacement process registered for Active " + rankStr(r));
                }
                return reject(held +
                              "; it must be deactivated (deactivate_ranks or failure "
                              "reconciliation) before a replacement can register; retry");
            }
            return reject(held +
                          "; retry after its join_group deadline passes or it is "
                          "deactivated");
        }
    }

    const bool replaced = s.registered;
    ++info.incarnation;
    s = SlotState{};
    s.registered = true;
    s.nonce = b.nonce;
    info.member = b.is_extension ? GroupMemberState::kInactive : GroupMemberState::kNone;
    info.rank = RankState::kSynced;
    info.endpoint = b.endpoint;
    // Reports about the previous process in this slot must not vouch for
    // the new one.
    for (SlotState& other : slots_) {
        if (!other.links.empty())
            other.links[r] = false;
        if (!other.window_links.empty())
            other.window_links[r] = false;
    }
    tableChanged();
    log(LogLevel::kInfo, std::string(replaced ? "replaced" : "registered") + " " + rankStr(r) +
                             " incarnation " + std::to_string(info.incarnation) +
                             (b.is_extension ? " (extension)" : " (founder)"));
    send(r, RegisterReply{b.nonce, true, info.incarnation, ""});
    if (!b.is_extension)
        maybeBootstrap();
}

void Coordinator::maybeBootstrap() {
    if (view_.bootstrapped)
        return;
    for (uint32_t r = 0; r < config_.founding_size; ++r) {
        if (!slots_[r].registered)
            return;
    }
    std::vector<uint32_t> founders;
    for (uint32_t r = 0; r < config_.founding_size; ++r) {
        view_.slots[r].member = GroupMemberState::kActive;
        // Every founder reached the Coordinator and the launcher's rendezvous.
        view_.slots[r].rank = RankState::kHealthy;
        founders.push_back(r);
    }
    view_.bootstrapped = true;
    commitActiveSet(founders, {}, "bootstrap");
}

void Coordinator::onPublishEndpoint(uint32_t r, const PublishEndpoint& b) {
    if (view_.slots[r].endpoint == b.endpoint)
        return;
    view_.slots[r].endpoint = b.endpoint;
    tableChanged();
}

void Coordinator::onJoinRequest(uint32_t r, const JoinRequest& b) {
    SlotState& s = slots_[r];
    SlotInfo& info = view_.slots[r];
    const Millis timeout = b.timeout_ms ? Millis(b.timeout_ms) : config_.default_join_timeout;
    switch (info.member) {
        case GroupMemberState::kInactive:
            info.member = GroupMemberState::kAwaitingActivation;
            s.join_deadline = now_ + timeout;
            s.join_timeout = timeout;
            s.join_blocker.clear();
            tableChanged();
            log(LogLevel::kInfo, rankStr(r) + " is awaiting activation");
            break;
        case GroupMemberState::kAwaitingActivation:
            if (!s.join_deadline || *s.join_deadline < now_ + timeout) {
                s.join_deadline = now_ + timeout;
                s.join_timeout = timeout;
            }
            break;
        case GroupMemberState::kActive:
            sendViewTo(r);  // already in: the joiner completes on this view
            break;
        default:
            send(r, JoinRejected{StatusCode::kInvalidArgument,
                                 rankStr(r) + " is a founding member; founders become Active at "
                                              "bootstrap and do not call join_group"});
            break;
    }
}

void Coordinator::onLeave(uint32_t r) {
    SlotInfo& info = view_.slots[r];
    const bool was_active = info.member == GroupMemberState::kActive;
    info.member = view_.bootstrapped || r >= config_.founding_size ? GroupMemberState::kLeft
                                                                   : GroupMemberState::kNone;
    info.rank = RankState::kOffline;
    info.endpoint.clear();
    slots_[r] = SlotState{};
    for (SlotState& other : slots_) {
        if (!other.links.empty())
            other.links[r] = false;
    }
    tableChanged();
    log(LogLevel::kInfo, rankStr(r) + " left the group");
    if (was_active)
        commitActiveSet({}, {r}, rankStr(r) + " left");
}

void Coordinator::advance() {
    if (window_ && (now_ >= window_->deadline || everyoneAccountedFor()))
        closeWindow();
    evaluateProposals();
    expireJoins();
}

void Coordinator::expireJoins() {
    for (uint32_t r = 0; r < slots_.size(); ++r) {
        SlotState& s = slots_[r];
        SlotInfo& info = view_.slots[r];
        if (info.member != GroupMemberState::kAwaitingActivation || !s.join_deadline ||
            now_ < *s.join_deadline) {
            continue;
        }
        std::string reason = "join_group for " + rankStr(r) + " timed out after " +
                             std::to_string(s.join_timeout.count()) + " ms: ";
        if (s.join_blocker.empty()) {
            reason += "no online member proposed activate_ranks/recover_ranks for it";
        } else {
            reason += "its activation could not commit: " + s.join_blocker;
        }
        info.member = GroupMemberState::kInactive;
        s.join_deadline.reset();
        s.join_blocker.clear();
        tableChanged();
        log(LogLevel::kWarn, reason);
        send(r, JoinRejected{StatusCode::kTimeout, reason});
        out_.push_back(JoinFailed{r, reason});
    }
}

void Coordinator::flush(std::vector<CoordinatorEffect>* out) {
    // A registrant learns its incarnation before the others learn about it,
    // so it can answer their link probes with the right incarnation.
    std::vector<CoordinatorEffect> rest;
    for (CoordinatorEffect& e : out_) {
        const auto* s = std::get_if<SendTo>(&e);
        const bool reply = s && std::holds_alternative<RegisterReply>(s->message.body);
        (reply ? *out : rest).push_back(std::move(e));
    }
    // Then the table, before anything else from this event, so a member that
    // gets a result or a rejection already holds the view it refers to.
    if (view_changed_) {
        ++view_.revision;
        out->push_back(Broadcast{recipients(), makeMessage(view_.toMessage())});
    } else {
        std::sort(view_requests_.begin(), view_requests_.end());
        view_requests_.erase(std::unique(view_requests_.begin(), view_requests_.end()),
                             view_requests_.end());
        for (uint32_t r : view_requests_) {
            out->push_back(SendTo{r, makeMessage(view_.toMessage())});
        }
    }
    for (CoordinatorEffect& e : rest)
        out->push_back(std::move(e));
    out_.clear();
    view_changed_ = false;
    view_requests_.clear();
}

// ---- helpers ---------------------------------------------------------------

bool Coordinator::linked(const std::vector<bool>& row, uint32_t peer) const {
    return !row.empty() && row[peer];
}

bool Coordinator::bidirectional(uint32_t a, uint32_t b) const {
    return linked(slots_[a].links, b) && linked(slots_[b].links, a);
}

std::vector<uint32_t> Coordinator::recipients() const {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < slots_.size(); ++r) {
        if (slots_[r].registered)
            ranks.push_back(r);
    }
    return ranks;
}

ControlMessage Coordinator::makeMessage(MessageBody body) const {
    ControlMessage m;
    m.header.group_id = config_.group_id;
    m.header.sender_rank = kCoordinatorSender;
    m.header.sender_incarnation = 0;
    m.header.view_epoch = view_.epoch;
    m.header.secret = config_.secret;
    m.body = std::move(body);
    return m;
}

void Coordinator::send(uint32_t rank, MessageBody body) {
    out_.push_back(SendTo{rank, makeMessage(std::move(body))});
}

void Coordinator::broadcast(MessageBody body) {
    out_.push_back(Broadcast{recipients(), makeMessage(std::move(body))});
}

void Coordinator::commitActiveSet(const std::vector<uint32_t>& activated,
                                  const std::vector<uint32_t>& deactivated,
                                  const std::string& cause, bool restart_all) {
    ++view_.epoch;
    for (SlotInfo& info : view_.slots) {
        if (info.member != GroupMemberState::kActive)
            info.active_since = 0;
        else if (restart_all || info.active_since == 0)
            info.active_since = view_.epoch;
    }
    for (uint32_t r : activated)
        view_.slots[r].active_since = view_.epoch;
    tableChanged();
    ViewCommitted c;
    c.epoch = view_.epoch;
    c.active_mask = view_.activeMask();
    c.group_size = groupSizeFromMask(c.active_mask);
    c.activated = activated;
    c.deactivated = deactivated;
    c.cause = cause;
    log(LogLevel::kInfo, "epoch " + std::to_string(c.epoch) + " committed (" + cause +
                             "): group size " + std::to_string(c.group_size));
    out_.push_back(std::move(c));
    recomputeHealth();
}

uint32_t Coordinator::activeCount() const {
    return static_cast<uint32_t>(view_.activeRanks().size());
}

}  // namespace mooncake::pg::control_plane
