// MooncakeBackend's collective worker: the queue every collective goes
// through in issue order, the one thread that runs their core calls (with
// the op's executor around each, executor.h), and how a failed op completes
// its Work.
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/spin_wait.h"
#include "mooncake-pg/torch/backend.h"

namespace mooncake::pg {

// ---------------------------------------------------------------------------
// The collective worker.

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::enqueue(
    c10d::OpType type, const char* op_name, std::vector<at::Tensor> outputs,
    std::chrono::milliseconds requested_timeout, GroupSized sized, Staging staging, CoreOp run,
    bool kernel_call) {
    {
        // Checked before the executor queues any device work for the op.
        std::lock_guard<std::mutex> lock(queue_mu_);
        TORCH_CHECK(accepting_, "Mooncake PG: ", op_name, " on group '", config_.group_name,
                    "' after the group was shut down or aborted");
    }
    Executor* executor = executorFor(staging, op_name);
    std::shared_ptr<DeviceOp> device_op = executor->issue(std::move(staging));
    auto work = c10::make_intrusive<MooncakeWork>(rank_, type, std::move(outputs), max_group_size_,
                                                  device_op->devices());
    work->addFence(device_op->fence());
    {
        std::lock_guard<std::mutex> lock(queue_mu_);
        TORCH_CHECK(accepting_, "Mooncake PG: ", op_name, " on group '", config_.group_name,
                    "' after the group was shut down or aborted");
        queue_.push_back(Task{work, op_name, opTimeout(requested_timeout), std::move(run),
                              groupSize(), sized, executor, std::move(device_op), kernel_call,
                              std::chrono::steady_clock::now(), /*taken=*/{}});
        queued_.store(queue_.size(), std::memory_order_release);
    }
    // Costs no system call while the worker is still polling (workerLoop).
    queue_cv_.notify_one();
    track(work);
    return work;
}

void MooncakeBackend::workerLoop() {
    // Copy-backs into user tensors (non-contiguous outputs, list outputs)
    // must not be recorded by autograd, whatever the caller's grad mode.
    at::NoGradGuard no_grad;
    // While kernel calls are in flight the worker polls them between ops,
    // sleeping this long at most once a poll found nothing to do.
    constexpr auto kInFlightPollSleep = std::chrono::microseconds(50);
    // While graphs holding captured calls exist, how often the idle worker
    // watches their replays: well under the fabric's liveness probe period of a local
    // peer (EngineFabric::kLivenessProbeMs, 25 ms).
    constexpr auto kGraphWatchPeriod = std::chrono::milliseconds(10);
    while (true) {
        Task task;
        bool aborted = false;
        auto idle_since = std::chrono::steady_clock::now();
        while (kernelCallsInFlight() && queued_.load(std::memory_order_acquire) == 0) {
            const size_t before = kernels_in_flight_.size();
            pollKernelCalls();
            if (ownerGone())
                return;
            if (kernels_in_flight_.size() != before)
                idle_since = std::chrono::steady_clock::now();
            if (std::chrono::steady_clock::now() - idle_since < spinBudget()) {
                std::this_thread::yield();
                continue;
            }
            std::unique_lock<std::mutex> lock(queue_mu_);
            if (!accepting_)
                break;
            queue_cv_.wait_for(lock, kInFlightPollSleep, [this] { return !queue_.empty(); });
        }
        // The next op of a caller that issues ops back to back comes within
        // microseconds; polling for it first spares both sides a futex
        // round trip and the wake-up latency (core/spin_wait.h). Shutdown
        // needs no poll: it is seen under the lock below.
        if (!kernelCallsInFlight())
            spinUntil(
                [this] {
                    return queued_.load(std::memory_order_acquire) != 0 || kernelCallsInFlight();
                },
                spinBudget());
        {
            std::unique_lock<std::mutex> lock(queue_mu_);
            if (!kernelCallsInFlight()) {
                // A call the caller launched itself (maybeLaunchOnCaller) is
                // counted under queue_mu_: polled from the loop above.
                const auto ready = [this] {
                    return !queue_.empty() || !accepting_ || kernelCallsInFlight();
                };
                // Replays of captured calls run unseen by the host: while
                // idle, and while a graph that holds one exists, the worker
                // watches for them (watchGraphReplays), once more after the
                // last graph went.
                while (graphsAlive() || graphs_.owed.load()) {
                    if (queue_cv_.wait_for(lock, kGraphWatchPeriod, ready))
                        break;
                    const bool none_alive = !graphsAlive();
                    lock.unlock();
                    watchGraphReplays();
                    graphs_.passes.fetch_add(1);
                    if (none_alive)
                        graphs_.owed.store(false);
                    if (ownerGone())
                        return;
                    lock.lock();
                }
                queue_cv_.wait(lock, ready);
            }
            const Task* next = queue_.empty() ? nullptr : &queue_.front();
            if (next || !accepting_) {
                // Only this thread pops the queue, so `next` stays put.
                lock.unlock();
                settleBefore(next);
                if (ownerGone())
                    return;
                lock.lock();
            }
            if (queue_.empty()) {
                if (accepting_)
                    continue;  // a poll found nothing queued yet
                return;
            }
            task = std::move(queue_.front());
            queue_.pop_front();
            queued_.store(queue_.size(), std::memory_order_relaxed);
            aborted = abort_pending_;
            worker_runs_op_.store(true, std::memory_order_relaxed);
        }
        task.taken = std::chrono::steady_clock::now();
        if (aborted) {
            countWorkerOp(task);
            task.work->markFailed(
                failureMessage(task.op_name, Aborted("the group was aborted"), task.timeout), {});
        } else {
            runTask(task);
        }
        // Completing the Work may have destroyed the backend (stopWorker).
        if (ownerGone())
            return;
        // What the op changed (the window's slot counter, the last call's
        // stream) is seen by a caller that finds this clear.
        worker_runs_op_.store(false, std::memory_order_release);
    }
}

void MooncakeBackend::countWorkerOp(const Task& task) {
    // Before the op completes, so a caller back from its wait sees it counted.
    const auto nanos = [](std::chrono::steady_clock::duration d) {
        return static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    };
    worker_queued_ns_.fetch_add(nanos(task.taken - task.enqueued), std::memory_order_relaxed);
    worker_run_ns_.fetch_add(nanos(std::chrono::steady_clock::now() - task.taken),
                             std::memory_order_relaxed);
    worker_ops_.fetch_add(1, std::memory_order_relaxed);
}

void MooncakeBackend::settleBefore(const Task* next) {
    adoptCallerLaunches();
    if (!kernelCallsInFlight())
        return;
    // A kernel call of the same membership view queues behind the calls in
    // flight (up to the window's result slots); anything else (a host op, a
    // view change to apply first, shutdown) waits for them, so their
    // failures are reported and their views applied in issue order. The
    // control plane's epoch moves before the view callback raises
    // latest_epoch_, and the next call applies that view at once: a window
    // set up for it while calls of the old view wait would fail them as
    // stale (their peers, already drained, would then time out on them).
    const uint64_t in_flight_epoch = kernels_in_flight_.back().launch.epoch;
    const bool may_queue =
        next != nullptr && next->kernel_call && latest_epoch_.load() == in_flight_epoch &&
        applied_epoch_.load() == in_flight_epoch && (!host_ || host_->epoch() == in_flight_epoch);
    finishKernelCalls(may_queue ? device::kMaxKernelCallsInFlight - 1 : 0);
}

void MooncakeBackend::runTask(Task& task) {
    const Deadline deadline = Deadline::after(task.timeout);
    bool from_core = true;
    kernel_ran_ = false;
    kernel_failed_.clear();
    kernel_launch_.reset();
    // The caller's launches came before this op: they complete first.
    adoptCallerLaunches();
    Status status = task.executor->beforeCore(*task.device_op, deadline);
    if (status.ok()) {
        status = runElastic(task, deadline, &from_core);
    } else {
        from_core = false;
    }
    const Status finished = task.executor->finish(task.device_op, status.ok());
    if (status.ok() && !finished.ok()) {
        status = finished;
        from_core = false;
    }
    if (status.ok() && kernel_launch_) {
        // Queued on the device: the Work completes once the worker has read
        // the kernels' result (pollKernelCalls).
        KernelInFlight k;
        k.work = task.work;
        k.op_name = task.op_name;
        k.timeout = task.timeout;
        k.deadline = deadline;
        k.fence = task.device_op->fence();
        k.launch = *kernel_launch_;
        kernel_launch_.reset();
        kernels_in_flight_.push_back(std::move(k));
        calls_in_flight_.fetch_add(1, std::memory_order_release);
        task.run = nullptr;
        task.device_op.reset();
        countWorkerOp(task);
        if (!cuda_blocking_wait_)
            task.work->markLaunched();
        return;
    }
    // The closure holds the host mirrors and user tensors; the executor
    // holds what its queued device work still touches.
    task.run = nullptr;
    task.device_op.reset();
    countWorkerOp(task);
    if (status.ok()) {
        task.work->markSucceeded();
        return;
    }
    std::vector<int> failed;
    if (from_core)
        failed = kernel_ran_ ? kernel_failed_ : comm_->lastFailure().failed_ranks;
    failWork(task.work, task.op_name, task.timeout, deadline, status, failed, from_core);
}

void MooncakeBackend::failWork(const c10::intrusive_ptr<MooncakeWork>& work, const char* op_name,
                               std::chrono::milliseconds timeout, Deadline deadline,
                               const Status& status, const std::vector<int>& failed,
                               bool from_core) {
    std::string message = failureMessage(op_name, status, timeout);
    // Mismatched calls and ops refused because an earlier one broke the
    // epoch are not new evidence.
    const bool evidence = from_core && status.code() != StatusCode::kInvalidArgument &&
                          status.code() != StatusCode::kAborted &&
                          status.code() != StatusCode::kEpochChanged;
    if (evidence) {
        if (!failed.empty()) {
            message += " [failed ranks:";
            for (int r : failed)
                message += " " + std::to_string(r);
            message += "]";
        }
        // In the default mode this waits for the reconciliation, so the
        // Work completes with the new view already committed. A timeout
        // (this rank's, or a peer's it was told of by an abort notice, which
        // may come before this rank's own deadline) leaves the op no time to
        // count on: the reconciliation it needs waits for a stalled member
        // until the window ends (reconcileWaitEnd).
        reportFailure(failed,
                      status.code() == StatusCode::kTimeout ? Deadline::after({}) : deadline);
    }
    work->markFailed(message, failed);
}

std::string MooncakeBackend::failureMessage(const char* op_name, const Status& status,
                                            std::chrono::milliseconds timeout) const {
    std::string text = "Mooncake PG: " + std::string(op_name) + " failed on rank " +
                       std::to_string(config_.rank) + " of group '" + config_.group_name + "' (" +
                       getBackendName() + "): ";
    // Said in words, with "timeout" standing alone: scripts and torch's own
    // suite recognise a timeout by the regex " (Timed out|closed|timeout) ".
    if (status.code() == StatusCode::kTimeout) {
        text += "timed out after the op's timeout of " + std::to_string(timeout.count()) +
                " ms: " + status.message();
    } else {
        text += status.toString();
    }
    // Arguments were validated locally before the op was queued, so an
    // invalid-argument failure from the core means the ranks disagree.
    if (status.code() == StatusCode::kInvalidArgument) {
        text +=
            " (the ranks' calls mismatch: every rank must pass the same op, dtype, "
            "sizes and root)";
    }
    return text;
}

void MooncakeBackend::stopWorker(bool abort_pending) {
    {
        std::lock_guard<std::mutex> lock(queue_mu_);
        accepting_ = false;
        if (abort_pending)
            abort_pending_ = true;
    }
    queue_cv_.notify_all();
    if (abort_pending)
        abortDeviceCalls();
    if (worker_.get_id() == std::this_thread::get_id()) {
        // Destroyed from a callback on the worker: what is queued runs (or
        // fails) here, since the worker is let go once this returns.
        at::NoGradGuard no_grad;
        while (true) {
            Task task;
            {
                std::lock_guard<std::mutex> lock(queue_mu_);
                if (queue_.empty())
                    break;
                task = std::move(queue_.front());
                queue_.pop_front();
            }
            task.taken = std::chrono::steady_clock::now();
            if (abort_pending) {
                countWorkerOp(task);
                task.work->markFailed(
                    failureMessage(task.op_name, Aborted("the group was aborted"), task.timeout),
                    {});
            } else {
                runTask(task);
            }
        }
        // The window goes with the group: its calls in flight complete first
        // (told to stop above when aborting).
        finishKernelCalls(0);
    }
    if (abort_pending && fabric_) {
        // The running collective waits on peers' flags; marking every peer
        // failed turns those waits into immediate errors instead of waits to
        // the deadline.
        for (int p = 0; p < max_group_size_; ++p) {
            if (p != config_.rank)
                fabric_->markPeerFailed(p);
        }
    }
    joinOrRelease(worker_);
}

}  // namespace mooncake::pg
