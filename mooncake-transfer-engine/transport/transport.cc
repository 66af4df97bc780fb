// The completion side of a transfer, shared by the engine and its
// transports (transport.h): a task's state and the batch's signal.
#include "mooncake-transfer-engine/transport/transport.h"

#include <algorithm>

namespace mooncake::te {

// ---- TransferTask -----------------------------------------------------------

void TransferTask::complete(Status status) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (state_.load(std::memory_order_relaxed) != TransferState::kPending)
            return;
        error_ = std::move(status);
        state_.store(error_.ok() ? TransferState::kCompleted : TransferState::kFailed,
                     std::memory_order_release);
    }
    if (signal_)
        signal_->notify(this);
}

// ---- CompletionSignal ---------------------------------------------------------

// No lost wakeup. complete() stores the task's state, then (after a fence)
// reads waiters_; a waiter raises waiters_, then (after a fence) reads the
// state. With the fences at least one sees the other's write: either the
// waiter finds the task done, or notify() sees the waiter and, under mu_,
// where the waiter registered before sleeping, wakes it.
void CompletionSignal::notify(const TransferTask* task) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_relaxed) == 0)
        return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (std::find(awaited_.begin(), awaited_.end(), task) == awaited_.end())
            return;
    }
    cv_.notify_all();
}

bool CompletionSignal::wait(const TransferTask& task, Deadline deadline) {
    if (task.done())
        return true;
    std::unique_lock<std::mutex> lock(mu_);
    awaited_.push_back(&task);
    waiters_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool done = true;
    while (!task.done()) {
        if (deadline.at() == Deadline::Clock::time_point::max()) {
            cv_.wait(lock);  // wait_until(max) would overflow
        } else if (cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout) {
            done = task.done();
            break;
        }
    }
    awaited_.erase(std::find(awaited_.begin(), awaited_.end(), &task));
    waiters_.fetch_sub(1, std::memory_order_relaxed);
    return done;
}

TransferStatus TransferTask::status() const {
    TransferStatus s;
    s.state = state_.load(std::memory_order_acquire);
    if (s.state == TransferState::kFailed) {
        std::lock_guard<std::mutex> lock(mu_);
        s.error = error_;
    }
    return s;
}

}  // namespace mooncake::te
