// MooncakeBackend's kernel calls in flight: the worker queues a kernel
// call's kernels on the communication stream and takes the next op at once;
// the call's Work is completed later, when the worker finds the call ended
// (its last kernel marks its result slot) and reads that slot
// (docs/design/pg-cuda.md).
//
// Calls complete in issue order. While one runs, the worker turns host
// evidence (abort(), a dead peer, a newer view that deactivates a member)
// into the group's abort word and, past the kernels' own deadline plus a
// grace, sets the word itself; kernels that outlive that too leave the
// group unusable (device_stuck_). Anything but a kernel call of the same
// view waits for the calls in flight first (settleBefore), so failures are
// reported, and views applied, in issue order.
//
// Calls captured in a CUDA graph are not in flight here: their replays run
// without the host. While a graph holding one exists (device/
// live_graph_calls.h), the idle worker watches for them (watchGraphReplays):
// host evidence goes into the abort word, and a failed replay is reported to
// the control plane.
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/spin_wait.h"
#include "mooncake-pg/device/group_window.h"
#include "mooncake-pg/device/live_graph_calls.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

namespace {

// How long the kernels get past their own deadline (the op's timeout, from
// when they start) to notice it or the abort word, and return.
constexpr auto kKernelGrace = std::chrono::seconds(2);
// How often the evidence behind the abort word is checked while a call runs.
constexpr auto kKernelWatchPeriod = std::chrono::milliseconds(1);
// How often the fence of the oldest call in flight is queried besides: a
// call whose kernels ended reads as ended in its slot long before. The
// fence only backs that mark up, so rarely: each query takes the CUDA
// driver's lock, which the caller's thread needs for its launches and
// event records.
constexpr auto kFenceQueryPeriod = std::chrono::milliseconds(1);

}  // namespace

void MooncakeBackend::adoptCallerLaunches() {
    // The caller counts its launch after handing it over, both under
    // queue_mu_: a launch not counted yet is seen at the next poll, and
    // every one made before the worker took an op is counted by then.
    if (calls_in_flight_.load(std::memory_order_acquire) == kernels_in_flight_.size())
        return;
    std::lock_guard<std::mutex> lock(caller_launches_mu_);
    for (KernelInFlight& k : caller_launches_)
        kernels_in_flight_.push_back(std::move(k));
    caller_launches_.clear();
}

void MooncakeBackend::pollKernelCalls() {
    adoptCallerLaunches();
    while (!kernels_in_flight_.empty()) {
        KernelInFlight& front = kernels_in_flight_.front();
        device::GroupWindow& w = *device_window_;
        if (!front.front) {
            // Its predecessors have finished, so its kernels run from about now.
            front.front = true;
            front.host_deadline =
                Deadline::after(std::chrono::nanoseconds(front.launch.timeout_ns) + kKernelGrace);
        }
        const auto now = std::chrono::steady_clock::now();
        bool ready = w.callEnded(front.launch.slot);
        if (!ready && now >= next_fence_query_) {
            ready = front.fence->ready();
            next_fence_query_ = now + kFenceQueryPeriod;
        }
        if (!ready) {
            if (now >= next_kernel_watch_) {
                next_kernel_watch_ = now + kKernelWatchPeriod;
                {
                    // abort(), not shutdown(): queued calls still run at shutdown.
                    std::lock_guard<std::mutex> lock(queue_mu_);
                    if (abort_pending_)
                        w.setAbort(device::kAbortGroupAborted);
                }
                if (const uint64_t reason =
                        abortReasonAgainst(front.launch.size, front.launch.epoch)) {
                    // Later calls go through the worker, which applies the
                    // view this evidence leads to before it runs them.
                    caller_launch_ready_.store(false);
                    w.setAbort(reason);
                }
            }
            if (!front.host_deadline.expired())
                return;
            if (!front.abort_sent) {
                // Past the kernels' own deadline: ask them to stop, once
                // more. What they report is a timeout naming the peer they
                // waited on.
                w.setAbort(device::kAbortDeadline);
                front.abort_sent = true;
                front.host_deadline = Deadline::after(kKernelGrace);
                return;
            }
            // The abort word stays set: the kernels may still run.
            caller_launch_ready_.store(false);
            device_stuck_ =
                "the group's device collective kernels did not return after their deadline and "
                "the abort word; the GPU may be stuck";
            while (!kernels_in_flight_.empty()) {
                KernelInFlight k = std::move(kernels_in_flight_.front());
                kernels_in_flight_.pop_front();
                calls_in_flight_.fetch_sub(1, std::memory_order_release);
                k.work->markFailed(
                    failureMessage(k.op_name,
                                   Internal(std::string(k.op_name) + ": " + device_stuck_),
                                   k.timeout),
                    {});
                if (ownerGone())
                    return;
            }
            return;
        }
        KernelInFlight k = std::move(front);
        kernels_in_flight_.pop_front();
        k.fence->markEnded();
        std::vector<int> failed;
        Status st = device::resultStatus(w.hostResult(k.launch.slot), k.op_name, &failed);
        if (!st.ok())
            caller_launch_ready_.store(false);
        // After the slot was read: a caller may reuse it from here.
        calls_in_flight_.fetch_sub(1, std::memory_order_release);
        if (st.code() == StatusCode::kTimeout && failed.size() == 1 &&
            fabric_->peerFailed(failed[0])) {
            // The peer it waited on is gone, not slow: say so, as the core does.
            st = PeerFailure(std::string(k.op_name) + ": rank " + std::to_string(failed[0]) +
                             " failed");
        }
        // Evidence set while calls ran was for them; the next call starts
        // clean (counting a caller's launch not adopted yet).
        if (!kernelCallsInFlight() && device_stuck_.empty())
            w.clearAbort();
        if (st.ok()) {
            k.work->markSucceeded();
        } else {
            // wait() may have returned already: say it where it is seen.
            MC_LOG(kWarn, "pg") << "rank " << config_.rank << ": " << k.op_name
                                << " failed after its kernels were queued: " << st.toString()
                                << " (slot " << k.launch.slot << ", epoch " << k.launch.epoch
                                << ")";
            // A call of an older view than the applied one (completed after
            // a failure before it changed the view) is not new evidence.
            failWork(k.work, k.op_name, k.timeout, k.deadline, st, failed,
                     k.launch.epoch == applied_epoch_.load());
        }
        // Completing the Work may have destroyed the backend.
        if (ownerGone())
            return;
    }
}

uint64_t MooncakeBackend::abortReasonAgainst(int size, uint64_t epoch) const {
    std::function<bool(int)> still_active;
    control_plane::GroupView newer;
    if (host_ && latest_epoch_.load() != epoch) {
        newer = host_->view();
        still_active = [&newer](int p) { return newer.isActive(static_cast<uint32_t>(p)); };
    }
    return device::abortReasonFor(
        config_.rank, size, [this](int p) { return fabric_->peerFailed(p); }, still_active);
}

int64_t MooncakeBackend::liveGraphCalls() const {
    return graphs_.live_calls ? graphs_.live_calls->count() : 0;
}

void MooncakeBackend::watchGraphReplays() {
    device::GroupWindow* w = device_window_.get();
    if (!w || !w->hasView() || !device_stuck_.empty())
        return;
    {
        std::lock_guard<std::mutex> lock(queue_mu_);
        if (abort_pending_ || !accepting_)
            return;  // closing: abort() owns the word, and nothing is left to report
    }
    // A dead peer only, and only while the window serves the current view.
    // After a membership change (a member taken out included) the replays
    // fail as stale at their first kernel, which tells the user more: the
    // reason this watch set is withdrawn then, and the next eager call sets
    // the window up for the new view.
    const uint64_t applied = applied_epoch_.load();
    if (latest_epoch_.load() == applied && w->epoch() == deviceEpochOf(applied)) {
        // No newer view, so only a dead peer can be the reason.
        const uint64_t reason = abortReasonAgainst(w->size(), applied);
        if (reason != 0) {
            w->setAbort(reason);
            graphs_.abort_reason = reason;
        }
    } else if (graphs_.abort_reason != 0) {
        // Under the queue lock: abort() raises abort_pending_ there before
        // it sets the word, so its reason is never withdrawn here.
        std::lock_guard<std::mutex> lock(queue_mu_);
        if (!abort_pending_ && w->abortReason() == graphs_.abort_reason)
            w->clearAbort();
        graphs_.abort_reason = 0;
    }

    std::optional<GraphWatch::Failure> report;
    {
        std::lock_guard<std::mutex> lock(graphs_.mu);
        if (graphs_.evidence) {
            report = graphs_.evidence;
            graphs_.evidence.reset();
        } else if (!graphs_.failure_taken) {
            const device::DeviceOpResult r = w->graphResult();
            if (r.status != 0) {
                graphs_.failure_taken = true;
                if (device::isFailureEvidence(r))
                    report = GraphWatch::Failure{r, applied};
            }
        }
    }
    // Framework-managed groups report nothing: check_graph_replays tells the
    // user, who decides. A view applied since the failure was its recovery.
    if (!report || !config_.options->auto_deactivate_on_failure ||
        report->epoch != applied_epoch_.load())
        return;
    std::vector<int> failed;
    const Status st =
        device::resultStatus(report->result, "a collective replayed from a CUDA graph", &failed);
    MC_LOG(kWarn, "pg") << "rank " << config_.rank << " of group '" << config_.group_name
                        << "': " << st.toString()
                        << "; reported to the control plane as failure evidence";
    graphs_.failures_reported.fetch_add(1);
    // As failWork does for an eager op: a timeout leaves no deadline to count on.
    reportFailure(failed, st.code() == StatusCode::kTimeout
                              ? Deadline::after({})
                              : Deadline::afterMs(timeout_ms_.load()));
}

void MooncakeBackend::forgetGraphFailures() {
    device::GroupWindow* w = device_window_.get();
    std::lock_guard<std::mutex> lock(graphs_.mu);
    graphs_.evidence.reset();
    // One standing now happened in an older view: check_graph_replays still
    // raises it, but it is no evidence against the members of this one.
    if (w && w->graphResult().status != 0)
        graphs_.failure_taken = true;
}

void MooncakeBackend::finishKernelCalls(size_t keep) {
    adoptCallerLaunches();
    PollPacer pacer;
    while (kernels_in_flight_.size() > keep) {
        const size_t before = kernels_in_flight_.size();
        pollKernelCalls();
        if (ownerGone())
            return;
        if (kernels_in_flight_.size() != before) {
            pacer.reset();
        } else {
            pacer.pause();
        }
    }
}

}  // namespace mooncake::pg
