#include "mooncake-pg/torch/work.h"

#include <algorithm>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/core/spin_wait.h"

namespace mooncake::pg {

std::exception_ptr makeBackendError(const std::string& message) {
    try {
        C10_THROW_ERROR(DistBackendError, message);
    } catch (...) {
        return std::current_exception();
    }
}

MooncakeWork::MooncakeWork(int rank, c10d::OpType op_type, std::vector<at::Tensor> outputs,
                           int hint_size, std::vector<c10::Device> devices)
    : c10d::Work(rank, op_type),
      outputs_(std::move(outputs)),
      hint_size_(hint_size),
      devices_(std::move(devices)) {}

void MooncakeWork::addFence(std::shared_ptr<DeviceFence> fence) {
    if (fence)
        fences_.push_back(std::move(fence));
}

MooncakeWork::~MooncakeWork() = default;

bool MooncakeWork::isCompleted() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!completed_)
            return false;
    }
    for (auto& f : fences_) {
        if (!f->ready())
            return false;
    }
    return true;
}

bool MooncakeWork::isSuccess() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ && !exception_;
}

std::exception_ptr MooncakeWork::exception() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return exception_;
}

std::vector<at::Tensor> MooncakeWork::result() {
    return outputs_;
}

bool MooncakeWork::wait(std::chrono::milliseconds timeout) {
    try {
        waitHost(timeout);
    } catch (...) {
        // A failed op's fence is recorded too (the executor arms it whatever
        // happened): ordering the stream after it anyway joins the branch a
        // CUDA graph capture took in at issue, so the capture ends cleanly
        // and the caller sees this error, not an unjoined capture.
        if (done_.load(std::memory_order_acquire)) {
            for (auto& f : fences_) {
                try {
                    f->streamWait();
                } catch (...) {  // the op's own failure is the one to report
                }
            }
        }
        throw;
    }
    for (auto& f : fences_)
        f->streamWait();
    return true;
}

void MooncakeWork::synchronize() {
    if (fences_.empty())
        return;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return completed_ || launched_.load(); });
    }
    for (auto& f : fences_)
        f->block();
    // A kernel call completes once the worker has read its result, shortly
    // after its fence; the kernels' own deadline bounds that.
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return completed_; });
    const std::exception_ptr error = exception_;
    const bool requested = future_requested_;
    lock.unlock();
    if (requested)
        future_->wait();  // as in waitHost()
    if (error)
        std::rethrow_exception(error);
}

void MooncakeWork::waitHost(std::chrono::milliseconds timeout) {
    auto budget = spinBudget();
    if (timeout != kNoTimeout)
        budget = std::min<std::chrono::microseconds>(budget, timeout);
    const auto host_part_done = [this] {
        return done_.load(std::memory_order_acquire) || launched_.load(std::memory_order_acquire);
    };
    spinUntil(host_part_done, budget);
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
        cv_.wait(lock, host_part_done);
    } else if (!cv_.wait_for(lock, timeout, host_part_done)) {
        TORCH_CHECK_WITH(DistBackendError, false, "Mooncake PG: ", c10d::opTypeToString(opType_),
                         " did not complete within ", timeout.count(),
                         " ms of wait(); it is still running");
    }
    // Not completed: queued on the device, the Work completes (or fails)
    // later and its Future at launch (markLaunched); no error yet.
    const std::exception_ptr error = exception_;
    const bool requested = future_requested_;
    lock.unlock();
    // The completing (or launching) thread settles a requested future right
    // after it releases mutex_ (its callbacks may call back into this Work);
    // waiting for that here means a caller that returns from wait() finds
    // the future done, as torch's own backends guarantee (one asked for
    // later is completed by getFuture() itself).
    if (requested)
        future_->wait();
    if (error)
        std::rethrow_exception(error);
}

void MooncakeWork::abort() {
    markFailed("Mooncake PG: " + c10d::opTypeToString(opType_) + " was aborted", {});
}

c10::intrusive_ptr<c10::ivalue::Future> MooncakeWork::getFuture() {
    bool mine = false;
    bool settled = false;
    std::exception_ptr error;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!future_) {
            // With devices, the Future records events on the completing
            // thread's current streams and makes callbacks and value()
            // consumers wait on them.
            static const c10::TypePtr kTensorList = c10::ListType::create(c10::TensorType::get());
            future_ = c10::make_intrusive<c10::ivalue::Future>(kTensorList, devices_);
        }
        future_requested_ = true;
        settled = launched_.load() || completed_;
        if (settled && !future_claimed_) {
            future_claimed_ = true;
            mine = true;
            // A launched op's Future completes as at launch, whatever the
            // Work's outcome since (markLaunched).
            if (!launched_.load())
                error = exception_;
        }
    }
    if (mine) {
        completeFuture(error);
    } else if (settled) {
        future_->wait();  // its completing thread is at it
    }
    return future_;
}

void MooncakeWork::completeFuture(const std::exception_ptr& error) {
    if (error) {
        future_->setError(error);
        return;
    }
    const auto complete = [this] { future_->markCompleted(c10::IValue(outputs_)); };
    // Asked for while the op's device work is pending, the Future's events
    // go on the op's stream, not the caller's current one. Once it is done,
    // any stream will do, even after the group and its stream are gone.
    bool pending = false;
    for (auto& f : fences_)
        pending = pending || !f->ready();
    if (!pending) {
        complete();
        return;
    }
    fences_.front()->onStream([&] {
        // A batch's fences may sit on several streams (a synchronous op's is
        // its caller's): the Future's events follow all of them.
        for (size_t i = 1; i < fences_.size(); ++i)
            fences_[i]->streamWait();
        complete();
    });
}

int MooncakeWork::sourceRank() const {
    const int source = source_rank_.load();
    TORCH_CHECK(source >= 0, "Mooncake PG: _source_rank() of a ", c10d::opTypeToString(opType_),
                " Work: only a completed recv has a source rank");
    return source;
}

bool MooncakeWork::localSuccess() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return local_success_;
}

at::Tensor MooncakeWork::failedRanksHint() const {
    at::Tensor hint = at::zeros({hint_size_}, at::TensorOptions().dtype(at::kInt));
    std::lock_guard<std::mutex> lock(mutex_);
    auto* data = hint.data_ptr<int32_t>();
    for (int r : failed_ranks_) {
        if (r >= 0 && r < hint_size_)
            data[r] = 1;
    }
    return hint;
}

std::string MooncakeWork::errorMessage() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_message_;
}

std::vector<int> MooncakeWork::failedRanks() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_ranks_;
}

void MooncakeWork::complete(std::exception_ptr error, const std::string& message,
                            const std::vector<int>& failed_ranks) {
    std::vector<Callback> callbacks, host_callbacks;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (completed_)
            return;
        completed_ = true;
        exception_ = error;
        local_success_ = !error;
        error_message_ = message;
        failed_ranks_ = failed_ranks;
        callbacks.swap(callbacks_);
        host_callbacks.swap(host_part_callbacks_);
        done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    // Outside the lock: Future callbacks (DDP hooks, then()) may call back
    // into this Work.
    if (claimRequestedFuture())
        completeFuture(error);
    for (auto& cb : host_callbacks)
        cb(*this);
    for (auto& cb : callbacks)
        cb(*this);
}

bool MooncakeWork::claimRequestedFuture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_claimed_ || !future_requested_)
        return false;
    future_claimed_ = true;
    return true;
}

void MooncakeWork::markLaunched() {
    // As NCCL's: the Future completes once the kernels are queued. Its CUDA
    // events, recorded on the op's stream after the kernels, order its
    // consumers after them. A later failure is the Work's (exception(),
    // synchronize()), not the Future's. One not asked for yet is completed
    // so when it is (getFuture()).
    bool claimed = false;
    std::vector<Callback> host_callbacks;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (completed_)
            return;  // its host part was done with it
        launched_.store(true, std::memory_order_release);
        claimed = future_requested_ && !future_claimed_;
        future_claimed_ = future_claimed_ || claimed;
        host_callbacks.swap(host_part_callbacks_);
    }
    cv_.notify_all();
    if (claimed)
        completeFuture(nullptr);
    for (auto& cb : host_callbacks)
        cb(*this);
}

void MooncakeWork::markSucceeded() {
    complete(nullptr, {}, {});
}

void MooncakeWork::markFailed(const std::string& message, const std::vector<int>& failed_ranks) {
    complete(makeBackendError(message), message, failed_ranks);
}

void MooncakeWork::onHostPartDone(Callback cb) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!completed_ && !launched_.load()) {
            host_part_callbacks_.push_back(std::move(cb));
            return;
        }
    }
    cb(*this);
}

void MooncakeWork::onCompletion(Callback cb) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!completed_) {
            callbacks_.push_back(std::move(cb));
            return;
        }
    }
    cb(*this);
}

}  // namespace mooncake::pg
