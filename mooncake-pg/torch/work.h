// MooncakeWork: the c10d::Work of one Mooncake PG operation. The op runs on
// the backend's worker thread (collectives) or the P2P progress thread; the
// Work is handed to the caller at once and completed from that thread.
//
// A Work of CUDA tensors also holds device fences (one per op; several for a
// coalesced batch): its host part completes when the core op is done and
// the copies back to the user's tensors are queued on the group's
// communication stream; the fences complete when those copies have run.
// A kernel call's host part is done once its kernels are queued
// (markLaunched, which also completes the Future, as NCCL's): the Work
// completes later, when the worker has read the kernels' result.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace mooncake::pg {

// Completion of an op's device work (a CUDA event on the stream the work
// went on, or the end mark of a kernel call its caller launched);
// implemented by the CUDA executor.
class DeviceFence {
public:
    virtual ~DeviceFence() = default;
    // Makes the calling thread's current stream wait for it (no host block).
    virtual void streamWait() = 0;
    // Blocks the calling thread until it has completed.
    virtual void block() = 0;
    virtual bool ready() = 0;
    // Runs `fn` with the stream the fence is recorded on as the calling
    // thread's current stream: CUDA events `fn` records there (a Future's)
    // come after the op.
    virtual void onStream(const std::function<void()>& fn) = 0;
    // The worker's, once it has read the end mark of the kernel call the
    // fence stands for: only a fence without an event of its own needs it.
    virtual void markEnded() {}
};

class MooncakeWork : public c10d::Work {
public:
    using Callback = std::function<void(MooncakeWork&)>;

    // `outputs` are what getFuture() yields on success; `hint_size` is the
    // length of failed_ranks_hint (the group's rank slots); `devices`: the
    // CUDA devices of the outputs, on which the Future records its events.
    MooncakeWork(int rank, c10d::OpType op_type, std::vector<at::Tensor> outputs, int hint_size,
                 std::vector<c10::Device> devices = {});
    ~MooncakeWork() override;

    // Before the Work is handed out only.
    void addFence(std::shared_ptr<DeviceFence> fence);
    const std::vector<std::shared_ptr<DeviceFence>>& fences() const { return fences_; }
    const std::vector<c10::Device>& devices() const { return devices_; }

    // With fences: also whether they have completed.
    bool isCompleted() override;
    bool isSuccess() const override;
    std::exception_ptr exception() const override;
    std::vector<at::Tensor> result() override;
    // Waits for the host part (as wait() does), blocks on the fences, then
    // waits for the Work to complete and rethrows its failure (a kernel
    // call's failure is known only once its kernels have run).
    // CPU work: nothing to order on a stream, so this is a no-op.
    void synchronize() override;
    // Blocks the calling CPU thread until the op's host part is done
    // (kNoTimeout: as long as it takes; the op itself is bounded by its
    // deadline), then rethrows the failure, if the Work has failed by then,
    // as c10::DistBackendError carrying the core's message. With fences, the
    // caller's current stream then waits on them, so work it queues
    // afterwards sees the outputs; the CPU does not wait for the device (a
    // kernel call that fails later reports it through synchronize(),
    // exception() and is_success(); its Future completed at launch). It
    // polls for up to spinBudget()
    // (core/spin_wait.h) before it sleeps, so a small op that completes
    // within microseconds is not delayed by a wake-up.
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    // Completes the Work as failed if it is still pending. The op itself may
    // still run to its deadline: a collective must stay in lockstep with the
    // other ranks, so it is not cut short.
    void abort() override;
    // Completed when first asked for (a Future's CUDA events cost an eager
    // op several microseconds, and most callers never ask): as NCCL's, it
    // completes once the kernels are queued (launched ops), else with the
    // Work; pending until then.
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

    // The rank a recv received from (torch's Work._source_rank()): its peer,
    // or for recv from any source the rank whose message it took. Throws
    // for other ops and for an any-source recv that took no message.
    int sourceRank() const override;
    // Set before the Work completes.
    void setSourceRank(int rank) { source_rank_.store(rank); }

    // Whether the op completed every transfer at this rank (false while pending).
    bool localSuccess() const;
    // int32 CPU tensor, one entry per rank slot: 1 where the core named the
    // rank in its failure evidence.
    at::Tensor failedRanksHint() const;
    // The failure's message and rank evidence (empty while pending or on success).
    std::string errorMessage() const;
    std::vector<int> failedRanks() const;

    // The host part of a kernel call is done: its kernels and fences are
    // queued, so wait() may return before the Work completes.
    void markLaunched();
    bool launched() const { return launched_.load(std::memory_order_acquire); }
    // Completion. Callable from any thread; the first call wins and later
    // ones are ignored (an aborted Work stays aborted).
    void markSucceeded();
    void markFailed(const std::string& message, const std::vector<int>& failed_ranks);
    // Runs `cb` once the Work completes (at once, on this thread, if it has).
    void onCompletion(Callback cb);
    // Runs `cb` once the op's host part is done, as wait() sees it: launched
    // (a kernel call) or completed, whichever comes first (at once, on this
    // thread, if it is).
    void onHostPartDone(Callback cb);

private:
    // markSucceeded (`error` null) and markFailed: a Work already completed
    // stays as it is; otherwise it completes, then its requested Future and
    // its callbacks (onHostPartDone ones not yet run, then onCompletion).
    void complete(std::exception_ptr error, const std::string& message,
                  const std::vector<int>& failed_ranks);

    // wait() without the fences; returns after rethrowing any failure.
    void waitHost(std::chrono::milliseconds timeout);
    // Whether the caller is the one to complete future_: getFuture() was
    // called and no one has claimed it yet.
    bool claimRequestedFuture();
    // Completes future_ (the caller claimed it): with `error`, else with the
    // outputs, its CUDA events recorded after the op's fences.
    void completeFuture(const std::exception_ptr& error);

    const std::vector<at::Tensor> outputs_;
    const int hint_size_;
    const std::vector<c10::Device> devices_;
    std::vector<std::shared_ptr<DeviceFence>> fences_;
    std::atomic<int> source_rank_{-1};
    // Made by getFuture() (under mutex_, before future_requested_ is set):
    // most Works are never asked for one, and making it cost every op.
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    // Mirrors Work::completed_ for wait()'s polling, which must not take
    // mutex_ (the completing thread needs it). Set under mutex_ after
    // everything wait() reads, so an acquire load that sees true sees them.
    std::atomic<bool> done_{false};
    // Set under mutex_ by markLaunched (wait()'s host part is done).
    std::atomic<bool> launched_{false};
    // Guarded by Work::mutex_, like completed_ and exception_.
    bool local_success_ = false;
    std::string error_message_;
    std::vector<int> failed_ranks_;
    std::vector<Callback> callbacks_;
    std::vector<Callback> host_part_callbacks_;
    bool future_claimed_ = false;
    // getFuture() was called: completions complete future_ too.
    bool future_requested_ = false;
};

// A c10::DistBackendError as an exception_ptr, for Work and Future errors.
std::exception_ptr makeBackendError(const std::string& message);

}  // namespace mooncake::pg
