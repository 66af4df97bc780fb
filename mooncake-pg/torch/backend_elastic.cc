// MooncakeBackend's elastic membership: the control-plane hosts, applying
// committed views to the data plane, the epoch-aware retry of collectives,
// failure evidence per failure mode, and the pg.* membership calls.
//
// Views are applied only on the worker thread, between ops: the Communicator
// and P2PEngine are not thread-safe against a membership change, and every
// active rank must switch between the same two ops. Ranks learn a view at
// slightly different times; a rank still in the old epoch notices a peer in
// the new one (kEpochChanged from the round protocol) before either
// wrote any output, waits for the view, applies it and runs the op again.
//
// Environment knobs:
//   MC_PG_RECONCILE_WINDOW_MS  how long the Coordinator collects link reports
//                              after the first negative evidence (default
//                              30000). It must exceed the collective timeout:
//                              a member stuck in a collective cannot report
//                              before that collective times out.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include "mooncake-pg/control_plane/coordinator_host.h"
#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/device/group_window.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/store_adapter.h"
#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

namespace cp = control_plane;

namespace {

MC_ENV_INT(ReconcileWindowMs, "MC_PG_RECONCILE_WINDOW_MS", 30000)

// How long the Coordinator's process waits at shutdown for the other
// members to leave (CoordinatorHost::awaitOthersGone).
constexpr int64_t kLeaveDrainMs = 5000;

// Until when a failed op waits for the reconciliation in the default mode
// (docs/pg-elastic.md, "Failure modes"). A reconciliation closes at most one
// window after it opened, so two windows cover one already running plus the
// one this report may start. Within that, the op's own deadline rules: the
// caller asked for its answer by then. An op with no time left (it failed by
// a timeout: runTask passes an expired deadline then) still gets the two
// windows: its report is what the reconciliation waits for, and a member that
// stopped calling collectives is only excluded once the window runs out,
// which no deadline already spent could allow.
Deadline reconcileWaitEnd(Deadline op_deadline, std::chrono::milliseconds window) {
    const Deadline cap = Deadline::after(window * 2);
    if (op_deadline.expired() || cap.at() < op_deadline.at())
        return cap;
    return op_deadline;
}

bool newerEpoch(const Status& st) {
    return st.code() == StatusCode::kEpochChanged;
}

std::string describeStatus(const char* call, const Status& st) {
    return std::string("Mooncake PG: ") + call + " failed: " + st.toString();
}

}  // namespace

void MooncakeBackend::startControlPlane(const std::string& group_key, const std::string& where) {
    const int64_t window = envReconcileWindowMs();
    TORCH_CHECK_VALUE(window > 0, "Mooncake PG: MC_PG_RECONCILE_WINDOW_MS=", window,
                      " must be a positive number of milliseconds");
    reconcile_window_ = std::chrono::milliseconds(window);
    const MooncakeBackendOptions& o = *config_.options;
    cp::FailureMode mode;
    mode.auto_deactivate_on_failure = o.auto_deactivate_on_failure;
    mode.auto_sync_on_failure = o.auto_sync_on_failure;
    const std::string prefix = group_key + "/cp";
    auto secret = store_->get(group_key + "/secret", Deadline::afterMs(timeout_ms_.load()));
    TORCH_CHECK_WITH(DistBackendError, secret.ok(), "Mooncake PG: ", where,
                     ": reading the group secret failed: ", secret.status().toString());

    if (!o.is_extension && config_.rank == 0) {
        cp::CoordinatorHostConfig cc;
        cc.key_prefix = prefix;
        cc.coordinator.group_id = group_key;
        cc.coordinator.secret = secret.value();
        cc.coordinator.max_group_size = static_cast<uint32_t>(max_group_size_);
        cc.coordinator.founding_size = static_cast<uint32_t>(config_.size);
        cc.coordinator.mode = mode;
        cc.coordinator.reconcile_window = reconcile_window_;
        // The default torch timeout (30 min) would make the default window
        // invalid; the window is only checked against explicit timeouts.
        if (reconcile_window_ > std::chrono::milliseconds(timeout_ms_.load())) {
            cc.coordinator.collective_timeout = std::chrono::milliseconds(timeout_ms_.load());
        } else if (std::getenv("MC_PG_RECONCILE_WINDOW_MS") != nullptr) {
            // Only worth a warning when the user chose the window; with both
            // defaults (30 s window, torch's 30 min timeout) it would print
            // on every init.
            MC_LOG(kWarn, "pg") << where << ": MC_PG_RECONCILE_WINDOW_MS=" << window
                                << " does not exceed the collective timeout " << timeout_ms_.load()
                                << " ms; a rank stuck in a collective may be judged dead";
        }
        auto coord = cp::CoordinatorHost::start(std::move(cc), store_.get());
        TORCH_CHECK_WITH(DistBackendError, coord.ok(), "Mooncake PG: ", where,
                         ": starting the Coordinator failed: ", coord.status().toString());
        coordinator_ = std::move(coord.value());
    }

    cp::MemberHostConfig mc;
    mc.key_prefix = prefix;
    mc.agent.group_id = group_key;
    mc.agent.secret = secret.value();
    mc.agent.rank = static_cast<uint32_t>(config_.rank);
    mc.agent.max_group_size = static_cast<uint32_t>(max_group_size_);
    mc.agent.is_extension = o.is_extension;
    mc.agent.mode = mode;
    mc.agent.register_timeout = std::chrono::milliseconds(timeout_ms_.load());
    // Probes must answer well inside the window (member_host.h).
    mc.probe_timeout = std::min(mc.probe_timeout, reconcile_window_ / 3);
    auto host = cp::MemberHost::create(
        std::move(mc), store_.get(),
        [this](const std::vector<int32_t>& mask, uint32_t, int size) { onView(mask, size); });
    TORCH_CHECK_WITH(DistBackendError, host.ok(), "Mooncake PG: ", where,
                     ": starting the member host failed: ", host.status().toString());
    host_ = std::move(host.value());
    Status st = host_->start(fabric_->endpoint(), Deadline::afterMs(timeout_ms_.load()));
    TORCH_CHECK_WITH(DistBackendError, st.ok(), "Mooncake PG: ", where,
                     ": registering with the Coordinator failed: ", st.toString());
    onView(host_->activeRanks(), host_->groupSize());
    // The bootstrap view goes to the data plane now, while no op can be
    // queued yet (the worker stays idle until the constructor returns).
    // Applied lazily at the first collective, its new epoch would restart
    // the P2P engine under sends the user had already posted.
    st = applyLatestView(Deadline::afterMs(timeout_ms_.load()));
    TORCH_CHECK_WITH(DistBackendError, st.ok(), "Mooncake PG: ", where,
                     ": applying the initial membership failed: ", st.toString());
}

void MooncakeBackend::stopControlPlane() {
    // A held view callback would keep the host thread from stopping.
    releaseViewsForTest();
    // Leaving (not just stopping) frees the slot at once instead of after a
    // failure reconciliation, and tells the Coordinator this process is done
    // with the store.
    if (host_)
        (void)host_->leave();
    if (coordinator_) {
        const Deadline d = Deadline::afterMs(std::min<int64_t>(timeout_ms_.load(), kLeaveDrainMs));
        const bool all_left = coordinator_->awaitOthersGone(
            [this](uint32_t r) {
                return fabric_ && static_cast<int>(r) < max_group_size_ &&
                       static_cast<int>(r) != config_.rank &&
                       fabric_->peerFailed(static_cast<int>(r));
            },
            d);
        if (!all_left)
            MC_LOG(kInfo, "pg") << "leaving before every member of the group did";
        coordinator_->stop();
        // Joiners must not take this generation for a running group
        // (MooncakeBackend::liveGeneration).
        Status st = store_->set(group_key_ + "/closed", "1");
        if (!st.ok())
            MC_LOG(kDebug, "pg") << "marking the group closed: " << st.toString();
    }
}

void MooncakeBackend::onView(const std::vector<int32_t>& mask, int group_size) {
    {
        std::unique_lock<std::mutex> lock(view_hold_.mu);
        if (view_hold_.armed) {
            view_hold_.holding = true;
            view_hold_.mask = mask;
            view_hold_.cv.notify_all();
            view_hold_.cv.wait_until(lock, view_hold_.until.at(),
                                     [this] { return !view_hold_.armed; });
            view_hold_.armed = false;
            view_hold_.holding = false;
        }
    }
    // Graphs captured in an older membership fail from their next replay on,
    // without touching a peer (kernel epochs are membership + 1); before the
    // user can see the new view.
    if (device::GroupWindow* w = device_window_ptr_.load(std::memory_order_acquire); w && host_) {
        w->noteCommittedEpoch(host_->epoch() + 1);
    }
    // The committed view, as the user sees it; the data plane follows at
    // its next op (applyLatestView).
    group_size_.store(group_size);
    at::Tensor cpu = at::empty({static_cast<int64_t>(mask.size())}, at::kInt);
    std::copy(mask.begin(), mask.end(), cpu.data_ptr<int32_t>());
    if (cpu.numel() == active_ranks_.numel())
        active_ranks_.copy_(cpu);
    if (host_)
        latest_epoch_.store(host_->epoch());
}

Status MooncakeBackend::applyLatestView(Deadline deadline) {
    if (!host_)
        return Status::OK();
    if (view_applied_ && latest_epoch_.load() == applied_epoch_ && host_->epoch() == applied_epoch_)
        return Status::OK();
    const cp::GroupView view = host_->view();
    if (view_applied_ && view.epoch == applied_epoch_)
        return Status::OK();
    std::vector<uint8_t> active(static_cast<size_t>(max_group_size_), 0);
    for (int r = 0; r < max_group_size_; ++r)
        active[r] = view.isActive(static_cast<uint32_t>(r)) ? 1 : 0;
    {
        std::lock_guard<std::mutex> lock(view_mu_);
        MC_RETURN_IF_ERROR(connectPeers(view, deadline));
    }
    MC_RETURN_IF_ERROR(group_comm_->setMembership(active, view.epoch));
    // P2P follows on its own (backend_p2p.cc); bringing it along here saves
    // the next post the detour through the poster.
    Status p2p = applyP2PView(deadline);
    if (!p2p.ok())
        MC_LOG(kWarn, "pg") << "P2P membership of epoch " << view.epoch << ": " << p2p.toString();
    comm_ = active[config_.rank] != 0 ? group_comm_.get() : solo_comm_.get();
    applied_group_size_ = view.groupSize();
    applied_epoch_ = view.epoch;
    view_applied_ = true;
    forgetGraphFailures();
    return Status::OK();
}

Status MooncakeBackend::runElastic(Task& task, Deadline deadline, bool* from_core) {
    const bool sized = task.sized != GroupSized::kNo;
    while (true) {
        *from_core = false;
        Status st = applyLatestView(deadline);
        if (!st.ok())
            return st.withContext("applying membership epoch " + std::to_string(latest_epoch_));
        // Against the view just applied, not group_size_: the view callback
        // that sets it may not have run yet, and the op would then run with
        // more members than its buffers have blocks for.
        const int size_now = host_ ? applied_group_size_ : groupSize();
        if (sized && size_now > task.group_size) {
            return OutOfRange("the group grew from " + std::to_string(task.group_size) + " to " +
                              std::to_string(size_now) +
                              " ranks after the op was issued; issue it again");
        }
        if (task.sized == GroupSized::kBlocks && comm_ == solo_comm_.get() &&
            config_.rank >= task.group_size) {
            // Local-only, and the buffers (sized for task.group_size ranks)
            // have no block of this rank: nothing to read or write.
            return Status::OK();
        }
        *from_core = true;
        try {
            st = task.run(deadline);
        } catch (const c10::Error& e) {
            *from_core = false;
            return Internal(e.what_without_backtrace());
        } catch (const std::exception& e) {
            *from_core = false;
            return Internal(e.what());
        }
        if (st.ok() || !newerEpoch(st) || !host_)
            return st;
        // Nothing was written yet (see the file comment): wait for the view
        // the peer already applied, then start over.
        const uint64_t seen = applied_epoch_;
        Status w =
            host_->awaitView([seen](const cp::GroupView& v) { return v.epoch > seen; }, deadline);
        if (!w.ok())
            return st.withContext("waiting for the newer membership view: " + w.toString());
    }
}

void MooncakeBackend::reportFailure(const std::vector<int>& failed, Deadline op_deadline) {
    if (!host_)
        return;
    std::vector<uint8_t> hint(static_cast<size_t>(max_group_size_), 0);
    for (int r : failed) {
        if (r >= 0 && r < max_group_size_)
            hint[r] = 1;
    }
    const MooncakeBackendOptions& o = *config_.options;
    if (o.auto_deactivate_on_failure && o.auto_sync_on_failure) {
        const Deadline d = reconcileWaitEnd(op_deadline, reconcile_window_);
        // Stamped with the epoch the op ran in: if the reconciliation of
        // this failure already ended (the others reported first), the
        // Coordinator takes it as stale instead of opening another one.
        Status st = host_->syncAfterFailure(false, hint, d, applied_epoch_);
        if (!st.ok()) {
            MC_LOG(kWarn, "pg") << "automatic sync_after_failure: " << st.toString()
                                << (st.code() == StatusCode::kTimeout
                                        ? " (the failed op completes without the new view; it "
                                          "is applied here once committed)"
                                        : "");
        }
        Status applied = applyLatestView(d);
        if (!applied.ok())
            MC_LOG(kWarn, "pg") << "applying the view after a failure: " << applied.toString();
        return;
    }
    if (o.auto_deactivate_on_failure) {
        host_->noteEvidence(hint, applied_epoch_);
        std::lock_guard<std::mutex> lock(evidence_mu_);
        unsynced_failure_ = true;
        if (unsynced_hint_.size() != hint.size())
            unsynced_hint_.assign(hint.size(), 0);
        for (size_t i = 0; i < hint.size(); ++i)
            unsynced_hint_[i] |= hint[i];
    }
    // Framework-managed: the Work's local_success/failed_ranks_hint are the
    // only report; the framework decides what to deactivate.
}

// ---------------------------------------------------------------------------
// pg.* calls.

std::vector<uint32_t> MooncakeBackend::slotList(const std::vector<int64_t>& ranks,
                                                const char* fn) const {
    std::vector<uint32_t> out;
    for (int64_t r : ranks) {
        TORCH_CHECK_VALUE(r >= 0 && r < max_group_size_, "mooncake.pg.", fn, ": rank ", r,
                          " is outside the group's rank slots [0, ", max_group_size_, ")");
        out.push_back(static_cast<uint32_t>(r));
    }
    TORCH_CHECK_VALUE(!out.empty(), "mooncake.pg.", fn, ": no ranks given");
    return out;
}

Status MooncakeBackend::applyViewOnWorker(const char* call, Deadline deadline) {
    // The data plane is switched only on the worker (file comment); a no-op
    // task makes it apply the view there, in order with queued ops.
    auto work = c10::make_intrusive<MooncakeWork>(rank_, c10d::OpType::UNKNOWN,
                                                  std::vector<at::Tensor>{}, max_group_size_);
    const auto left =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining()),
                 std::chrono::milliseconds(1));
    {
        std::lock_guard<std::mutex> lock(queue_mu_);
        if (!accepting_)
            return Aborted("the group was shut down");
        queue_.push_back(Task{work, call, left, [](Deadline) { return Status::OK(); }, groupSize(),
                              GroupSized::kNo, &cpu_executor_, std::make_shared<DeviceOp>(),
                              /*kernel_call=*/false, std::chrono::steady_clock::now(),
                              /*taken=*/{}});
    }
    queue_cv_.notify_one();
    try {
        work->wait(left);
    } catch (const c10::Error& e) {
        return Unavailable(e.what_without_backtrace());
    }
    return Status::OK();
}

void MooncakeBackend::joinGroup(std::chrono::milliseconds timeout) {
    TORCH_CHECK(host_, "mooncake.pg.join_group: the group has no control plane (shut down?)");
    const Deadline deadline = Deadline::after(timeout);
    Status st = host_->joinGroup(deadline);
    TORCH_CHECK_WITH(DistBackendError, st.ok(), describeStatus("join_group", st));
    // The host returns only after onView saw the activation (active_ranks,
    // size); return only with the data plane in the new membership as well,
    // so the next collective starts from it.
    st = applyViewOnWorker("join_group", deadline);
    TORCH_CHECK_WITH(
        DistBackendError, st.ok(),
        describeStatus("join_group", st.withContext("activated, but switching the data plane to "
                                                    "the new membership failed")));
}

void MooncakeBackend::activateRanks(const std::vector<int64_t>& ranks,
                                    std::chrono::milliseconds timeout) {
    TORCH_CHECK(host_, "mooncake.pg.activate_ranks: the group has no control plane");
    auto slots = slotList(ranks, "activate_ranks");
    for (uint32_t r : slots) {
        TORCH_CHECK_VALUE(static_cast<int>(r) < usable_slots_.load(),
                          "mooncake.pg.activate_ranks: rank ", r, " is beyond the usable slots (",
                          usable_slots_.load(), "); call extend_group_size_to first");
    }
    Status st = host_->activateRanks(slots, Deadline::after(timeout));
    TORCH_CHECK_WITH(DistBackendError, st.ok(), describeStatus("activate_ranks", st));
}

void MooncakeBackend::deactivateRanks(const std::vector<int64_t>& ranks,
                                      std::chrono::milliseconds timeout) {
    TORCH_CHECK(host_, "mooncake.pg.deactivate_ranks: the group has no control plane");
    Status st =
        host_->deactivateRanks(slotList(ranks, "deactivate_ranks"), Deadline::after(timeout));
    TORCH_CHECK_WITH(DistBackendError, st.ok(), describeStatus("deactivate_ranks", st));
}

void MooncakeBackend::syncAfterFailure() {
    TORCH_CHECK(host_, "mooncake.pg.sync_after_failure: the group has no control plane");
    bool failed = false;
    std::vector<uint8_t> hint;
    {
        std::lock_guard<std::mutex> lock(evidence_mu_);
        failed = unsynced_failure_;
        hint.swap(unsynced_hint_);
        unsynced_failure_ = false;
    }
    const Deadline d =
        Deadline::after(reconcile_window_ * 2 + std::chrono::milliseconds(timeout_ms_.load()));
    Status st = host_->syncAfterFailure(!failed, hint, d);
    TORCH_CHECK_WITH(DistBackendError, st.ok(), describeStatus("sync_after_failure", st));
}

std::vector<bool> MooncakeBackend::peerState(const std::vector<int64_t>& ranks) const {
    TORCH_CHECK(host_, "mooncake.pg.get_peer_state: the group has no control plane");
    std::vector<uint32_t> slots;
    for (int64_t r : ranks) {
        TORCH_CHECK_VALUE(r >= 0 && r < max_group_size_, "mooncake.pg.get_peer_state: rank ", r,
                          " is outside the group's rank slots [0, ", max_group_size_, ")");
        slots.push_back(static_cast<uint32_t>(r));
    }
    return host_->peerState(slots);
}

int MooncakeBackend::numSyncedRanks() const {
    return host_ ? host_->numSyncedRanks() : 0;
}

void MooncakeBackend::extendGroupSizeTo(int64_t size) {
    TORCH_CHECK_VALUE(size <= max_group_size_, "mooncake.pg.extend_group_size_to: ", size,
                      " exceeds the group's reserved max_group_size=", max_group_size_,
                      "; capacity is fixed when the group is created (pass a larger "
                      "MooncakeBackendOptions(max_group_size) to init_process_group)");
    TORCH_CHECK_VALUE(size >= groupSize(), "mooncake.pg.extend_group_size_to: ", size,
                      " is below the current group size ", groupSize());
    // Reserved slots are usable from creation on; nothing else to do.
}

void MooncakeBackend::holdViewsForTest(std::chrono::milliseconds bound) {
    std::lock_guard<std::mutex> lock(view_hold_.mu);
    view_hold_.armed = true;
    view_hold_.until = Deadline::after(bound);
}

std::vector<int32_t> MooncakeBackend::awaitHeldViewForTest(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(view_hold_.mu);
    if (!view_hold_.cv.wait_for(lock, timeout, [this] { return view_hold_.holding; }))
        return {};
    return view_hold_.mask;
}

void MooncakeBackend::releaseViewsForTest() {
    {
        std::lock_guard<std::mutex> lock(view_hold_.mu);
        view_hold_.armed = false;
    }
    view_hold_.cv.notify_all();
}

std::vector<std::string> MooncakeBackend::preferredHca(const std::string& location) const {
    if (!fabric_)
        return {};
    if (location.empty())
        return fabric_->engine().devices();
    auto hcas = fabric_->engine().preferredHca(location);
    TORCH_CHECK_VALUE(hcas.ok(), "mooncake.pg.get_preferred_hca: ", hcas.status().message());
    return hcas.value();
}

}  // namespace mooncake::pg
