#include "mooncake-pg/control_plane/member_host.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <type_traits>
#include <utility>

#include "mooncake-pg/control_plane/mailbox.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/random.h"

namespace mooncake::pg::control_plane {
namespace {

uint64_t randomNonce() {
    uint64_t nonce = 0;
    while (nonce == 0) {
        for (char c : randomHex(8))
            nonce = nonce << 4 | static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return nonce;
}

bool samePeers(const std::vector<PeerToProbe>& a, const std::vector<PeerToProbe>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
        return x.rank == y.rank && x.incarnation == y.incarnation && x.endpoint == y.endpoint;
    });
}

bool isNever(Deadline d) {
    return d.at() == Deadline::Clock::time_point::max();
}

}  // namespace

Result<std::unique_ptr<MemberHost>> MemberHost::create(MemberHostConfig config, KVStore* store,
                                                       ViewCallback on_view) {
    if (store == nullptr)
        return InvalidArgument("MemberHost: no KVStore");
    if (config.poll_interval.count() <= 0 || config.probe_timeout.count() <= 0 ||
        config.register_retry.count() <= 0 || config.answer_margin.count() < 0) {
        return InvalidArgument(
            "MemberHost: poll_interval, probe_timeout and register_retry must be positive");
    }
    if (config.agent.nonce == 0)
        config.agent.nonce = randomNonce();
    auto agent = MemberAgent::create(config.agent);
    if (!agent.ok())
        return agent.status();
    std::unique_ptr<MemberHost> host(
        new MemberHost(std::move(config), std::move(agent).value(), store, std::move(on_view)));
    host->thread_ = std::thread([h = host.get()] { h->run(); });
    return host;
}

MemberHost::MemberHost(MemberHostConfig config, MemberAgent agent, KVStore* store,
                       ViewCallback on_view)
    : config_(std::move(config)),
      rank_(config_.agent.rank),
      nonce_(config_.agent.nonce),
      mailbox_(store, config_.key_prefix),
      inbox_(mailbox_.processInbox(rank_, nonce_)),
      reader_(store, inbox_),
      on_view_(std::move(on_view)),
      agent_(std::move(agent)),
      suspects_(config_.agent.max_group_size, false),
      epoch_(agent_->epoch()) {}

MemberHost::~MemberHost() {
    stop();
}

void MemberHost::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    stop_flag_.store(true);
    cv_.notify_all();
    // From the view callback the thread cannot join itself; it exits on its
    // own once the callback returns.
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id())
        thread_.join();
}

// ---- the host thread -------------------------------------------------------

void MemberHost::run() {
    while (!stop_flag_.load()) {
        Millis wait;
        {
            std::lock_guard<std::mutex> lock(mu_);
            const Millis now = hostNow();
            wait = std::clamp(nextWake(now) - now, Millis(0), config_.poll_interval);
        }
        auto got = reader_.receive(Deadline::after(wait));
        const bool store_failed = !got.ok() && got.status().code() != StatusCode::kTimeout;
        if (store_failed && !store_error_logged_) {
            hostLog(LogLevel::kError, "rank " + std::to_string(rank_) + ": cannot read inbox " +
                                          inbox_ + ": " + got.status().toString());
            store_error_logged_ = true;
        } else if (got.ok()) {
            store_error_logged_ = false;
        }

        std::deque<ViewApplied> views;
        {
            std::lock_guard<std::mutex> lock(mu_);
            const Millis now = hostNow();
            if (got.ok())
                onBytes(now, got.value());
            runTimers(now);
            views.swap(views_to_deliver_);
        }
        // Outside the lock, so the callback may call the queries.
        for (const ViewApplied& v : views) {
            if (on_view_ && v.active_set_changed)
                on_view_(v.active_mask, static_cast<uint32_t>(v.epoch), v.group_size);
        }
        if (!views.empty()) {
            // Releases the completions that waited for these views.
            std::lock_guard<std::mutex> lock(mu_);
            views_delivered_ += views.size();
            cv_.notify_all();
        }
        if (store_failed && !stop_flag_.load()) {
            // A failing store answers at once; back off instead of spinning,
            // bounded by the poll interval so stop() stays prompt.
            std::this_thread::sleep_for(config_.poll_interval);
        }
    }
}

Millis MemberHost::nextWake(Millis now) const {
    Millis wake = now + config_.poll_interval;
    if (auto next = agent_->nextDeadline())
        wake = std::min(wake, *next);
    if (round_.active)
        wake = std::min(wake, round_.deadline);
    return wake;
}

void MemberHost::runTimers(Millis now) {
    if (round_.active && now >= round_.deadline)
        finishRound(now);
    if (auto next = agent_->nextDeadline(); next && *next <= now)
        execute(agent_->handle(Tick{now}));
}

void MemberHost::onBytes(Millis now, const std::string& bytes) {
    auto parsed = parseControlMessage(bytes);
    if (!parsed.ok()) {
        execute(agent_->handleBytes(now, bytes));  // it logs why it dropped them
        return;
    }
    ControlMessage& m = parsed.value();
    if (const auto* probe = std::get_if<Probe>(&m.body)) {
        answerProbe(m.header, *probe);
    } else if (const auto* reply = std::get_if<ProbeReply>(&m.body)) {
        onProbeReply(now, m.header, *reply);
    } else {
        execute(agent_->handle(Received{now, std::move(m)}));
    }
}

void MemberHost::execute(std::vector<AgentEffect> effects) {
    // The agent has handled the event that produced these effects: publish
    // its epoch before any of them (a send below may wait on the store).
    epoch_.store(agent_->epoch(), std::memory_order_release);
    for (AgentEffect& effect : effects) {
        if (auto* send = std::get_if<SendToCoordinator>(&effect)) {
            push(mailbox_.coordinatorInbox(), serialize(send->message),
                 messageTypeName(messageType(send->message)));
        } else if (auto* probe = std::get_if<ProbeLinks>(&effect)) {
            requestProbe(hostNow(), std::move(*probe));
        } else if (auto* view = std::get_if<ViewApplied>(&effect)) {
            views_to_deliver_.push_back(std::move(*view));
            ++views_queued_;
            cv_.notify_all();
        } else if (auto* done = std::get_if<OpCompleted>(&effect)) {
            if (waiting_ops_.count(done->request_id)) {
                done_ops_[done->request_id] = DoneOp{std::move(done->status), views_queued_};
                cv_.notify_all();
            }
        } else if (auto* log = std::get_if<Log>(&effect)) {
            hostLog(log->level, "rank " + std::to_string(rank_) + ": " + log->text);
        }
    }
}

void MemberHost::push(const std::string& inbox, const std::string& bytes, const char* what) {
    Status st = mailbox_.sendBytes(inbox, bytes);
    if (!st.ok()) {
        hostLog(LogLevel::kWarn, "rank " + std::to_string(rank_) + ": cannot send " + what +
                                     " to " + inbox + ": " + st.toString());
    }
}

// ---- probing ---------------------------------------------------------------

bool MemberHost::admitPeer(const MessageHeader& h, const char* what) const {
    const char* why = nullptr;
    if (h.group_id != config_.agent.group_id) {
        why = "another group";
    } else if (!constantTimeEquals(h.secret, config_.agent.secret)) {
        why = "wrong group secret";
    } else if (h.sender_rank >= config_.agent.max_group_size) {
        why = "sender is not a slot";
    }
    if (why != nullptr) {
        hostLog(LogLevel::kWarn,
                "rank " + std::to_string(rank_) + ": dropped " + what + ": " + why);
    }
    return why == nullptr;
}

ControlMessage MemberHost::peerMessage(MessageBody body) const {
    ControlMessage m;
    m.header.group_id = config_.agent.group_id;
    m.header.sender_rank = rank_;
    m.header.sender_incarnation = agent_->incarnation();
    m.header.view_epoch = agent_->epoch();
    m.header.secret = config_.agent.secret;
    m.body = std::move(body);
    return m;
}

void MemberHost::answerProbe(const MessageHeader& h, const Probe& p) {
    if (!admitPeer(h, "Probe"))
        return;
    // Before registration we have no incarnation to vouch for; the prober
    // probes again when the view announcing us reaches it.
    if (p.target_rank != rank_ || agent_->incarnation() == 0)
        return;
    push(mailbox_.processInbox(h.sender_rank, p.reply_nonce),
         serialize(peerMessage(ProbeReply{p.probe_id, agent_->incarnation()})), "ProbeReply");
}

void MemberHost::onProbeReply(Millis now, const MessageHeader& h, const ProbeReply& r) {
    if (!admitPeer(h, "ProbeReply"))
        return;
    auto it = round_.waiting.find(r.probe_id);
    // Late replies of an earlier round, or one from the wrong slot, prove nothing.
    if (!round_.active || it == round_.waiting.end() || it->second != h.sender_rank)
        return;
    round_.reached[it->second] = r.responder_incarnation;
    round_.waiting.erase(it);
    if (round_.waiting.empty())
        finishRound(now);
}

void MemberHost::requestProbe(Millis now, ProbeLinks request) {
    if (round_.active && samePeers(request.peers, round_.peers)) {
        // The round in flight probes the same peers and reports after this
        // request, which is all the agent asked for.
        return;
    }
    // A round over other peers is superseded. Waiting for it would hold the
    // report the new view needs (an activation waits for it) behind probes
    // of a peer that may be dead, up to probe_timeout; replies to its probes
    // no longer match a waiting id and are dropped.
    startRound(now, std::move(request.peers));
}

void MemberHost::startRound(Millis now, std::vector<PeerToProbe> peers) {
    round_ = ProbeRound{};
    round_.active = true;
    round_.deadline = now + config_.probe_timeout;
    round_.reached.assign(config_.agent.max_group_size, 0);
    for (const PeerToProbe& peer : peers) {
        if (peer.rank >= config_.agent.max_group_size || peer.rank == rank_ ||
            suspected(peer.rank)) {
            continue;
        }
        auto decoded = decodeEndpoint(peer.endpoint);
        if (!decoded) {
            hostLog(LogLevel::kDebug, "rank " + std::to_string(rank_) + ": rank " +
                                          std::to_string(peer.rank) +
                                          " published no inbox; counted unreachable");
            continue;
        }
        const uint64_t id = ++next_probe_id_;
        round_.waiting[id] = peer.rank;
        push(mailbox_.processInbox(peer.rank, decoded->nonce),
             serialize(peerMessage(Probe{id, peer.rank, peer.incarnation, nonce_})), "Probe");
    }
    round_.peers = std::move(peers);
    if (round_.waiting.empty())
        finishRound(now);
}

void MemberHost::finishRound(Millis now) {
    round_.active = false;
    std::vector<uint32_t> reached = std::move(round_.reached);
    // Evidence noted while the round ran counts as well.
    for (uint32_t r = 0; r < reached.size(); ++r) {
        if (suspected(r))
            reached[r] = 0;
    }
    execute(agent_->handle(LinksProbedCmd{now, std::move(reached)}));
}

void MemberHost::noteEvidenceLocked(const std::vector<uint8_t>& hint, uint64_t observed_epoch) {
    if (hint.size() != suspects_.size())
        return;  // the agent rejects the call and says why
    const uint64_t failed_in = observed_epoch != 0 ? observed_epoch : agent_->epoch();
    if (unreported_failure_epoch_ == 0 || failed_in < unreported_failure_epoch_)
        unreported_failure_epoch_ = failed_in;
    // A suspicion ends with its epoch. Evidence that arrives once a newer
    // view is applied (this rank reported late) or that names a rank the
    // view no longer has Active must not make this rank report that rank
    // unreachable now: a deactivated rank could then never be recovered.
    if (failed_in < agent_->epoch())
        return;
    if (suspects_epoch_ != agent_->epoch()) {
        std::fill(suspects_.begin(), suspects_.end(), false);
        suspects_epoch_ = agent_->epoch();
    }
    const GroupView& view = agent_->view();
    for (uint32_t r = 0; r < hint.size(); ++r) {
        if (hint[r] && r != rank_ && view.isActive(r))
            suspects_[r] = true;
    }
    // A round in flight stops waiting for the newly suspected: they count as
    // unreachable whatever they answer (finishRound), and a dead one would
    // hold the report, and with it the reconciliation, for probe_timeout.
    if (!round_.active)
        return;
    for (auto it = round_.waiting.begin(); it != round_.waiting.end();) {
        it = suspected(it->second) ? round_.waiting.erase(it) : std::next(it);
    }
    if (round_.waiting.empty())
        finishRound(hostNow());
}

bool MemberHost::suspected(uint32_t slot) const {
    return suspects_epoch_ == agent_->epoch() && slot < suspects_.size() && suspects_[slot];
}

// ---- blocking calls --------------------------------------------------------

uint64_t MemberHost::beginOp() {
    const uint64_t id = ++next_request_;
    waiting_ops_.insert(id);
    return id;
}

Millis MemberHost::wireTimeout(Deadline deadline) const {
    if (isNever(deadline))
        return Millis(0);  // the Coordinator's default
    const auto left = std::chrono::duration_cast<Millis>(deadline.remaining());
    return std::max({left - config_.answer_margin, left / 2, Millis(1)});
}

Status MemberHost::await(uint64_t id, Deadline deadline, const Describe& timed_out) {
    std::unique_lock<std::mutex> lock(mu_);
    auto delivered = [&] {
        auto it = done_ops_.find(id);
        return it != done_ops_.end() && views_delivered_ >= it->second.views_before;
    };
    auto ready = [&] { return stopping_ || delivered(); };
    if (isNever(deadline)) {
        cv_.wait(lock, ready);
    } else {
        cv_.wait_until(lock, deadline.at(), ready);
    }
    waiting_ops_.erase(id);
    // A completion still waiting for the callback at the deadline counts:
    // the agent's mirror already holds its view.
    if (auto it = done_ops_.find(id); it != done_ops_.end()) {
        Status st = std::move(it->second.status);
        done_ops_.erase(it);
        return st;
    }
    if (stopping_)
        return Aborted("the control-plane host of rank " + std::to_string(rank_) + " stopped");
    return Timeout(timed_out());
}

Status MemberHost::issueAndAwait(const std::function<AgentEvent(uint64_t id)>& make,
                                 Deadline deadline, const Describe& timed_out) {
    uint64_t id;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_)
            return Aborted("the control-plane host of rank " + std::to_string(rank_) + " stopped");
        id = beginOp();
        execute(agent_->handle(make(id)));
    }
    return await(id, deadline, timed_out);
}

Status MemberHost::start(const std::string& endpoint, Deadline deadline) {
    if (endpoint.size() > kMaxDataEndpointBytes) {
        return InvalidArgument("endpoint longer than " + std::to_string(kMaxDataEndpointBytes) +
                               " bytes");
    }
    const std::string encoded = encodeEndpoint(endpoint, nonce_);
    const std::string who = "rank " + std::to_string(rank_);
    while (true) {
        Status st = issueAndAwait(
            [&](uint64_t id) {
                return RegisterCmd{hostNow(), id, encoded};
            },
            deadline,
            [&] {
                return agent_->incarnation() == 0
                           ? who +
                                 ": no RegisterReply from the Coordinator before the deadline "
                                 "(is the Coordinator host running on rank 0?)"
                           : who +
                                 " registered, but the group did not bootstrap before the "
                                 "deadline (not every founding rank registered)";
            });
        if (st.ok()) {
            // An extension completes on the RegisterReply; the table that
            // shows it follows at once. Wait for it, so that the queries are
            // meaningful as soon as start() returns.
            Status shown = awaitView(
                [this](const GroupView& v) {
                    return v.slots[rank_].incarnation >= agent_->incarnation();
                },
                deadline);
            return shown.ok() ? shown : shown.withContext(who + " registered");
        }
        // A refused extension waits for its slot to be freed (the old process
        // deactivated by reconciliation); a founder's refusal is final.
        if (!config_.agent.is_extension || st.code() != StatusCode::kUnavailable)
            return st;
        std::unique_lock<std::mutex> lock(mu_);
        const auto retry_at = std::min(deadline.at(), Deadline::after(config_.register_retry).at());
        if (cv_.wait_until(lock, retry_at, [&] { return stopping_; }))
            return Aborted(who + ": the control-plane host stopped while registering");
        if (deadline.expired())
            return Timeout(who + ": registration still refused at the deadline: " + st.message());
        hostLog(LogLevel::kInfo, who + ": " + st.message() + "; retrying");
    }
}

Status MemberHost::publishEndpoint(const std::string& endpoint) {
    if (endpoint.size() > kMaxDataEndpointBytes) {
        return InvalidArgument("endpoint longer than " + std::to_string(kMaxDataEndpointBytes) +
                               " bytes");
    }
    std::lock_guard<std::mutex> lock(mu_);
    execute(agent_->handle(PublishEndpointCmd{hostNow(), encodeEndpoint(endpoint, nonce_)}));
    return Status::OK();
}

Status MemberHost::joinGroup(Deadline deadline) {
    return issueAndAwait(
        [&](uint64_t id) {
            return JoinGroupCmd{hostNow(), id, wireTimeout(deadline)};
        },
        deadline,
        [this] {
            return "join_group: rank " + std::to_string(rank_) +
                   " was not activated before the deadline and the Coordinator gave no verdict";
        });
}

Status MemberHost::activateRanks(const std::vector<uint32_t>& ranks, Deadline deadline) {
    return issueAndAwait(
        [&](uint64_t id) {
            return ActivateRanksCmd{hostNow(), id, ranks, wireTimeout(deadline)};
        },
        deadline,
        [] {
            return "activate_ranks: no result from the Coordinator (or the view of its commit) "
                   "before the deadline";
        });
}

Status MemberHost::deactivateRanks(const std::vector<uint32_t>& ranks, Deadline deadline) {
    return issueAndAwait(
        [&](uint64_t id) {
            return DeactivateRanksCmd{hostNow(), id, ranks};
        },
        deadline,
        [] {
            return "deactivate_ranks: no result from the Coordinator (or the view of its "
                   "commit) before the deadline";
        });
}

Status MemberHost::syncAfterFailure(bool local_success,
                                    const std::vector<uint8_t>& failed_ranks_hint,
                                    Deadline deadline, uint64_t observed_epoch) {
    return issueAndAwait(
        [&](uint64_t id) {
            // Before the command: the probe round it starts must already
            // leave the named ranks out.
            noteEvidenceLocked(failed_ranks_hint, observed_epoch);
            uint64_t failed_in = observed_epoch;
            if (!local_success && unreported_failure_epoch_ != 0)
                failed_in = failed_in != 0 ? std::min(failed_in, unreported_failure_epoch_)
                                           : unreported_failure_epoch_;
            unreported_failure_epoch_ = 0;
            return SyncAfterFailureCmd{hostNow(), id, local_success, failed_ranks_hint, failed_in};
        },
        deadline,
        [] {
            return "sync_after_failure: the Coordinator did not acknowledge the evidence or "
                   "finish the reconciliation before the deadline";
        });
}

void MemberHost::noteEvidence(const std::vector<uint8_t>& failed_ranks_hint,
                              uint64_t observed_epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    noteEvidenceLocked(failed_ranks_hint, observed_epoch);
}

Status MemberHost::leave() {
    // The thread stops first: once the Coordinator has our Leave, the rank
    // hosting the store may exit, and a store read still in flight here would
    // fail loudly (torch prints a stack for it).
    stop();
    std::lock_guard<std::mutex> lock(mu_);
    execute(agent_->handle(LeaveCmd{hostNow()}));
    return Status::OK();
}

// ---- queries ---------------------------------------------------------------

std::vector<int32_t> MemberHost::activeRanks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return agent_->activeRanks();
}

int MemberHost::groupSize() const {
    std::lock_guard<std::mutex> lock(mu_);
    return agent_->groupSize();
}

std::vector<bool> MemberHost::peerState(const std::vector<uint32_t>& ranks) const {
    std::lock_guard<std::mutex> lock(mu_);
    return agent_->peerState(ranks);
}

int MemberHost::numSyncedRanks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return agent_->numSyncedRanks();
}

uint64_t MemberHost::epoch() const {
    return epoch_.load(std::memory_order_acquire);
}

uint32_t MemberHost::incarnation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return agent_->incarnation();
}

GroupView MemberHost::view() const {
    std::lock_guard<std::mutex> lock(mu_);
    return agent_->view();
}

std::string MemberHost::peerEndpoint(uint32_t rank) const {
    std::lock_guard<std::mutex> lock(mu_);
    const GroupView& v = agent_->view();
    if (rank >= v.slots.size())
        return {};
    auto decoded = decodeEndpoint(v.slots[rank].endpoint);
    return decoded ? decoded->endpoint : std::string();
}

Status MemberHost::awaitView(const std::function<bool(const GroupView&)>& pred,
                             Deadline deadline) const {
    std::unique_lock<std::mutex> lock(mu_);
    // Like the blocking calls: not before the callback ran for the views
    // applied so far, or the caller (the torch worker applying the view and
    // rerunning an op) could complete an op while the user's copy of the
    // membership still shows the old view.
    auto holds = [&] { return pred(agent_->view()) && views_delivered_ >= views_queued_; };
    auto ready = [&] { return stopping_ || holds(); };
    if (isNever(deadline)) {
        cv_.wait(lock, ready);
    } else {
        cv_.wait_until(lock, deadline.at(), ready);
    }
    if (holds())
        return Status::OK();
    if (stopping_)
        return Aborted("the control-plane host of rank " + std::to_string(rank_) + " stopped");
    return Timeout("rank " + std::to_string(rank_) +
                   ": the awaited view did not arrive before the deadline");
}

}  // namespace mooncake::pg::control_plane
