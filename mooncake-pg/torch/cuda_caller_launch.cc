// MooncakeBackend::maybeLaunchOnCaller: a synchronous kernel call launched
// by the thread that issues it (MC_PG_CUDA_CALLER_LAUNCH=1;
// docs/design/pg-cuda.md).
//
// torch waits for a synchronous op at once, and its kernels go on the
// caller's own stream: the worker would only take the call, launch it there
// and hand wait() back, two thread hand-offs plus the worker's per-op
// bookkeeping, which is most of what a small eager collective costs beyond
// the launch itself. When the worker has nothing queued or running and the
// call is one it would launch the same way (the membership view and stream
// of its last kernel call, no failure or evidence seen since), the caller
// launches it itself. It holds queue_mu_ meanwhile, so the worker cannot
// take an op, and hands the worker only the completion: the call joins the
// calls in flight (adoptCallerLaunches), whose results the worker reads.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>

#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/call_seq.h"
#include "mooncake-pg/device/group_window.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/collective_tensors.h"
#include "mooncake-pg/torch/cuda_executor.h"
#include "mooncake-pg/torch/window_launch.h"

namespace mooncake::pg {

namespace {

// Whether `call` takes the window path with its own tensors: one of the
// single-tensor collectives, contiguous, and smaller (the larger side) than
// the direct path's threshold, below which no rank exchanges anything on
// the host for it, so the ranks agree on the path whoever launched it.
bool launchableByCaller(const KernelCall& call) {
    switch (call.collective) {
        case device::CudaCollective::kAllReduce:
        case device::CudaCollective::kAllGather:
        case device::CudaCollective::kReduceScatter:
        case device::CudaCollective::kAllToAll:
        case device::CudaCollective::kBroadcast:
            break;
        default:
            return false;
    }
    if (!call.output_blocks.empty() || !call.held.empty() || call.work_output.defined() ||
        call.results.has_value() || call.count == 0)
        return false;
    if (!call.input.is_contiguous() || !call.output.is_contiguous())
        return false;
    if (!call.input.is_same(call.output) &&
        at::get_overlap_status(call.input, call.output) != at::MemOverlapStatus::No)
        return false;
    const uint64_t blocks = call.blocks > 0 ? static_cast<uint64_t>(call.blocks) : 1;
    return call.count * dataTypeSize(call.dtype) * blocks < device::kDirectMinBytes;
}

}  // namespace

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::maybeLaunchOnCaller(
    const KernelCall& call, CudaExecutor& exec, std::chrono::milliseconds timeout) {
    if (!cuda_caller_launch_ || !caller_launch_ready_.load(std::memory_order_acquire) ||
        !launchableByCaller(call))
        return {};
    std::unique_lock<std::mutex> lock(queue_mu_);
    // Anything queued runs first, on the worker; so does a call while the
    // worker runs an op (it may be setting the window up for a new view).
    if (!accepting_ || abort_pending_ || !queue_.empty() ||
        worker_runs_op_.load(std::memory_order_acquire))
        return {};
    // Read with the worker idle: its last kernel call ran in the view the
    // window is set up for, with nothing against it seen since.
    if (!caller_launch_ready_.load(std::memory_order_acquire))
        return {};
    // A newer view is applied by the worker before the next call.
    const uint64_t epoch = applied_epoch_.load();
    if (latest_epoch_.load() != epoch || (host_ && host_->epoch() != epoch))
        return {};
    device::GroupWindow* w = device_window_ptr_.load(std::memory_order_acquire);
    if (w == nullptr || !w->hasView() || w->epoch() != deviceEpochOf(epoch))
        return {};
    const int size = w->size();
    if (call.blocks > 0 && call.blocks != size)
        return {};
    if (call.collective == device::CudaCollective::kBroadcast && call.root >= size)
        return {};
    // Room for one more result slot, as settleBefore keeps it.
    if (calls_in_flight_.load(std::memory_order_acquire) + 1 >=
        static_cast<size_t>(device::kMaxKernelCallsInFlight))
        return {};
    // Replays of captured calls are watched by the idle worker.
    if (graphsAlive() || graphs_.owed.load())
        return {};
    // The kernels go to the thread's current device: the worker sets the
    // group's (a device guard) when it differs.
    if (c10::cuda::current_device() != exec.device().index())
        return {};
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(exec.device().index()).stream();
    // On another stream the call would first wait for the last one
    // (CudaExecutor::followPreviousCall): the worker does that.
    if (stream != exec.lastCallStream())
        return {};

    const std::chrono::milliseconds op_timeout = opTimeout(timeout);
    const Deadline deadline = Deadline::after(op_timeout);
    const int64_t timeout_ns = std::min(deadline.remaining(), kMaxKernelWait).count();
    auto next = w->nextCall(timeout_ns, stream, /*captured=*/false);
    if (!next.ok())
        return {};
    const device::DeviceGroupView view = next.value();
    // As runKernelCall: with no call in flight, evidence was for calls done.
    if (!kernelCallsInFlight())
        w->clearAbort();
    const int slot = takeResultSlot(*w);
    const Status launched =
        launchOnWindow(call, view, collective_tensors::ptrOf(call.input),
                       collective_tensors::ptrOf(call.output), w->deviceResult(slot), stream);
    if (!launched.ok()) {
        // The members count the call anyway (see runKernelCall).
        (void)device::skipCall(view, stream);
        lock.unlock();
        TORCH_CHECK_WITH(DistBackendError, false, "Mooncake PG: ", call.op_name,
                         ": queuing the device kernels failed: ", launched.toString());
    }
    device_calls_.fetch_add(1);
    // No event: the worker completes the call from its end mark.
    std::shared_ptr<DeviceFence> fence = exec.callerCallFence(stream);
    auto work =
        c10::make_intrusive<MooncakeWork>(rank_, call.type, std::vector<at::Tensor>{call.output},
                                          max_group_size_, std::vector<c10::Device>{exec.device()});
    work->addFence(fence);
    // Before the worker can see it: it may complete the Work at once.
    if (!cuda_blocking_wait_)
        work->markLaunched();
    KernelInFlight k;
    k.work = work;
    k.op_name = call.op_name;
    k.timeout = op_timeout;
    k.deadline = deadline;
    k.fence = std::move(fence);
    k.launch = KernelLaunch{slot, size, epoch, timeout_ns};
    {
        std::lock_guard<std::mutex> launches(caller_launches_mu_);
        caller_launches_.push_back(std::move(k));
    }
    // Under queue_mu_: the idle worker's wait sees it (workerLoop).
    calls_in_flight_.fetch_add(1, std::memory_order_release);
    caller_launched_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    queue_cv_.notify_one();
    track(work);
    return work;
}

}  // namespace mooncake::pg
