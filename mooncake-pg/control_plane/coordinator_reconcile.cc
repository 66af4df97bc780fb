// Link reports, failure evidence and the reconciliation window.
#include <algorithm>

#include "mooncake-pg/control_plane/coordinator.h"
#include "mooncake-pg/control_plane/healthy_set.h"

namespace mooncake::pg::control_plane {
namespace {

std::string rankStr(uint32_t r) {
    return "rank " + std::to_string(r);
}

std::string listStr(const std::vector<uint32_t>& ranks) {
    std::string s = "[";
    for (size_t i = 0; i < ranks.size(); ++i)
        s += (i ? "," : "") + std::to_string(ranks[i]);
    return s + "]";
}

uint32_t clampMs(Millis d) {
    if (d.count() <= 0)
        return 0;
    if (d.count() > UINT32_MAX)
        return UINT32_MAX;
    return static_cast<uint32_t>(d.count());
}

}  // namespace

void Coordinator::onLinkReport(const MessageHeader& h, const LinkReport& b) {
    const uint32_t r = h.sender_rank;
    if (b.reached.size() != config_.max_group_size) {
        log(LogLevel::kWarn, "dropped LinkReport from " + rankStr(r) + ": " +
                                 std::to_string(b.reached.size()) + " entries, expected " +
                                 std::to_string(config_.max_group_size));
        return;
    }
    if (h.view_epoch > view_.epoch) {
        log(LogLevel::kWarn, "dropped LinkReport from " + rankStr(r) + ": epoch " +
                                 std::to_string(h.view_epoch) + " is ahead of " +
                                 std::to_string(view_.epoch));
        return;
    }
    if (h.view_epoch < view_.epoch) {
        // Observed under an older active set; the sender gets the current
        // view and reports again.
        log(LogLevel::kDebug, "ignored LinkReport from " + rankStr(r) + " for stale epoch " +
                                  std::to_string(h.view_epoch));
        sendViewTo(r);
        return;
    }
    std::vector<bool> row(config_.max_group_size, false);
    for (uint32_t j = 0; j < config_.max_group_size; ++j) {
        // Only a report about the process now in slot j counts for it.
        row[j] = j != r && slots_[j].registered && b.reached[j] != 0 &&
                 b.reached[j] == view_.slots[j].incarnation;
    }
    SlotState& s = slots_[r];
    s.links = row;
    ++change_count_;
    if (window_) {
        s.window_links = std::move(row);
        s.reported_in_window = true;
        s.heard_in_window = true;
    } else {
        recomputeHealth();
    }
}

void Coordinator::onEvidence(const MessageHeader& h, const FailureEvidence& b) {
    const uint32_t r = h.sender_rank;
    const std::string from =
        "evidence from " + rankStr(r) + " at epoch " + std::to_string(h.view_epoch);
    if (!b.failed_ranks_hint.empty() && b.failed_ranks_hint.size() != config_.max_group_size) {
        log(LogLevel::kWarn, "dropped " + from + ": failed_ranks_hint has " +
                                 std::to_string(b.failed_ranks_hint.size()) +
                                 " entries, expected " + std::to_string(config_.max_group_size));
        return;
    }
    if (h.view_epoch > view_.epoch) {
        log(LogLevel::kWarn, "dropped " + from + ": ahead of epoch " + std::to_string(view_.epoch));
        return;
    }
    if (h.view_epoch < view_.epoch) {
        // The failure happened under an older active set, which the current
        // one already replaced; blaming anyone now could hit a replacement.
        log(LogLevel::kInfo,
            "ignored stale " + from + " (current epoch " + std::to_string(view_.epoch) + ")");
    } else if (!b.local_success && !view_.isActive(r)) {
        log(LogLevel::kInfo, "ignored " + from + ": the sender is not Active");
    } else if (!b.local_success) {
        std::vector<uint32_t> blamed;
        std::vector<uint32_t> not_members;
        for (uint32_t j = 0; j < b.failed_ranks_hint.size(); ++j) {
            if (!b.failed_ranks_hint[j])
                continue;
            (j != r && view_.isActive(j) ? blamed : not_members).push_back(j);
        }
        if (blamed.empty() && !not_members.empty()) {
            log(LogLevel::kInfo,
                "ignored " + from + ": it only names non-active ranks " + listStr(not_members));
        } else {
            log(LogLevel::kWarn, "negative " + from + ", failed_ranks_hint " + listStr(blamed));
            if (!window_)
                openWindow("negative evidence from " + rankStr(r));
            for (uint32_t j : blamed)
                slots_[j].blamed_in_window = true;
        }
    }
    if (window_ && h.view_epoch == view_.epoch)
        slots_[r].heard_in_window = true;
    EvidenceAck ack;
    ack.request_id = b.request_id;
    if (window_) {
        ack.reconcile_id = window_->id;
        ack.window_remaining_ms = clampMs(window_->deadline - now_);
    } else {
        sendViewTo(r);
    }
    send(r, ack);
}

void Coordinator::openWindow(const std::string& why) {
    window_ = Window{next_reconcile_id_++, now_ + config_.reconcile_window};
    for (uint32_t r = 0; r < slots_.size(); ++r) {
        SlotState& s = slots_[r];
        s.reported_in_window = false;
        s.window_links.clear();
        s.blamed_in_window = false;
        s.heard_in_window = false;
        s.offline_at_open = view_.slots[r].rank == RankState::kOffline;
    }
    ++change_count_;
    log(LogLevel::kWarn, "reconciliation #" + std::to_string(window_->id) + " opened (" + why +
                             "); closes in " + std::to_string(config_.reconcile_window.count()) +
                             " ms");
    broadcast(ReconcileStart{window_->id, clampMs(config_.reconcile_window)});
}

// The window only bounds the wait for members that are alive but silent (a
// member stuck in a collective reports once that collective times out). It
// closes early once every registered process is accounted for: it reported
// its links in this window, or it is dead as far as anyone can tell:
//  - it was already judged Offline when the window opened, or
//  - an Active member's data plane named it in negative evidence, every
//    report of this window says it is unreachable, and it sent nothing
//    since the window opened.
// Its own report could not change the outcome then: with no link to any
// reporter it cannot share a healthy set with them.
bool Coordinator::everyoneAccountedFor() const {
    bool any_report = false;
    for (const SlotState& s : slots_)
        any_report = any_report || s.reported_in_window;
    if (!any_report)
        return false;
    for (uint32_t j = 0; j < slots_.size(); ++j) {
        const SlotState& s = slots_[j];
        if (!s.registered || s.reported_in_window)
            continue;
        if (s.offline_at_open && !s.heard_in_window)
            continue;
        if (!s.blamed_in_window || s.heard_in_window)
            return false;
        for (const SlotState& reporter : slots_) {
            if (reporter.reported_in_window && reporter.window_links[j])
                return false;
        }
    }
    return true;
}

void Coordinator::closeWindow() {
    const uint64_t id = window_->id;
    window_.reset();
    ++change_count_;

    // Candidates: processes that reported during the window, in rank order.
    std::vector<uint32_t> cand;
    for (uint32_t r = 0; r < slots_.size(); ++r) {
        if (slots_[r].registered && slots_[r].reported_in_window)
            cand.push_back(r);
    }
    LinkGraph graph(cand.size());
    std::vector<bool> preferred(cand.size());
    std::vector<bool> blamed(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) {
        preferred[i] = view_.isActive(cand[i]);
        blamed[i] = slots_[cand[i]].blamed_in_window;
        for (size_t j = i + 1; j < cand.size(); ++j) {
            const auto& a = slots_[cand[i]].window_links;
            const auto& b = slots_[cand[j]].window_links;
            if (a[cand[j]] && b[cand[i]])
                graph.connect(i, j);
        }
    }
    HealthyChoice choice = chooseHealthySet(graph, preferred, blamed);

    std::vector<bool> healthy(slots_.size(), false);
    ReconciliationResult result;
    result.reconcile_id = id;
    result.exact = choice.exact;
    for (size_t i : choice.members) {
        healthy[cand[i]] = true;
        result.healthy.push_back(cand[i]);
    }
    bool any_active_healthy = false;
    for (uint32_t r = 0; r < slots_.size(); ++r) {
        if (view_.isActive(r)) {
            if (healthy[r]) {
                any_active_healthy = true;
            } else {
                result.unhealthy_active.push_back(r);
            }
        }
        if (!slots_[r].registered)
            continue;
        RankState next = healthy[r] ? RankState::kHealthy : RankState::kOffline;
        if (view_.slots[r].rank != next) {
            view_.slots[r].rank = next;
            tableChanged();
        }
    }
    for (SlotState& s : slots_) {
        // A process that stayed silent through the window no longer vouches
        // for anything: its older report must not make it Healthy again.
        if (!s.reported_in_window)
            s.links.clear();
        s.reported_in_window = false;
        s.window_links.clear();
        s.blamed_in_window = false;
        s.heard_in_window = false;
        s.offline_at_open = false;
    }

    std::string summary = "reconciliation #" + std::to_string(id) + " closed: healthy " +
                          listStr(result.healthy) + ", unhealthy active " +
                          listStr(result.unhealthy_active) +
                          (choice.exact ? "" : " (greedy choice: graph too large)");
    if (!result.unhealthy_active.empty() && !any_active_healthy) {
        // Nobody we could keep: deactivating everyone helps no one, and the
        // likelier cause is that this host lost its network.
        log(LogLevel::kError, summary + "; no Active member is healthy, membership unchanged");
    } else if (!result.unhealthy_active.empty() && config_.mode.auto_deactivate_on_failure) {
        for (uint32_t r : result.unhealthy_active) {
            view_.slots[r].member = GroupMemberState::kInactive;
        }
        result.deactivated = true;
        log(LogLevel::kWarn, summary + "; deactivating them");
        commitActiveSet({}, result.unhealthy_active,
                        "failure reconciliation #" + std::to_string(id), /*restart_all=*/true);
    } else {
        log(result.unhealthy_active.empty() ? LogLevel::kInfo : LogLevel::kWarn,
            summary + (result.unhealthy_active.empty()
                           ? ""
                           : "; framework-managed mode: call deactivate_ranks to remove them"));
        // The failed operation left the members' data planes out of step;
        // a fresh epoch with the same Active set is their common restart point.
        commitActiveSet({}, {}, "resync after reconciliation #" + std::to_string(id),
                        /*restart_all=*/true);
    }

    ReconcileResult msg;
    msg.reconcile_id = id;
    msg.healthy.assign(slots_.size(), 0);
    for (uint32_t r : result.healthy)
        msg.healthy[r] = 1;
    msg.unhealthy_active = result.unhealthy_active;
    msg.deactivated = result.deactivated;
    broadcast(std::move(msg));
    out_.push_back(std::move(result));
}

void Coordinator::recomputeHealth() {
    // During a window the window decides; outside it, only processes that
    // are not Active move: an Active member changes health only through
    // reconciliation, so one odd report cannot flip it.
    if (window_)
        return;
    const std::vector<uint32_t> active = view_.activeRanks();
    for (uint32_t r = 0; r < slots_.size(); ++r) {
        if (!slots_[r].registered || view_.isActive(r))
            continue;
        bool connected = !slots_[r].links.empty();
        for (uint32_t a : active) {
            if (!connected)
                break;
            connected = bidirectional(r, a);
        }
        RankState& st = view_.slots[r].rank;
        if (connected && st != RankState::kHealthy) {
            st = RankState::kHealthy;
            tableChanged();
        } else if (!connected && st == RankState::kHealthy) {
            st = RankState::kSynced;
            tableChanged();
        }
    }
}

}  // namespace mooncake::pg::control_plane
