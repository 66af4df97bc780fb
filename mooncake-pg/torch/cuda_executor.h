// CudaExecutor: the executor of a group's CUDA ops (executor.h).
//
// One communication stream per group. At issue, on the caller's thread, the
// stream waits (event) on the caller's current stream, so the op reads its
// inputs after the caller's prior work (a synchronous kernel op goes on the
// caller's stream itself: Staging::onCallerStream), and the inputs are copied into the
// op's pinned host mirrors (Staging) on it. The worker runs the core op on
// the mirrors once those copies have completed, then queues the copies back
// into the user's tensors on the stream and records the op's fence (a CUDA
// event) after them. Work::wait() makes the caller's current stream wait on
// the fence; the user's tensors and the mirrors are held until the fence
// has completed (an op on its caller's stream is not held: stream order
// keeps its tensors).
//
// That host staging is the data path of every op route() does not give to
// the device kernels over IPC-mapped windows (mooncake-pg/device/; chosen by
// MC_PG_CUDA_PATH, docs/design/pg-cuda.md). A kernel op's tensors are only
// held (Staging::onDevice): the worker queues the kernels on the stream
// (cuda_collectives.cc), and its Work's fence follows them.
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/cuda/CUDAStream.h>

#include "mooncake-pg/device/routing.h"
#include "mooncake-pg/torch/executor.h"

namespace mooncake::pg {

using device::CudaCollective;
using device::CudaPath;
using device::CudaRoute;
using device::RouteQuery;

class CudaExecutor final : public Executor {
public:
    // Creates the communication stream on `device`; throws c10::Error when
    // CUDA is unusable there. `path`: the process's MC_PG_CUDA_PATH.
    CudaExecutor(c10::Device device, CudaPath path);
    ~CudaExecutor() override;

    c10::Device device() const { return device_; }
    c10::cuda::CUDAStream stream() const { return stream_; }

    CudaPath path() const { return path_; }
    // The path of one collective (device::routeFor under this executor's
    // setting): the same on every rank of a call.
    CudaRoute route(const RouteQuery& q) const { return device::routeFor(path_, q); }

    // Caller's thread: whether its current stream on this device is being
    // captured into a CUDA graph. Ops issued then are captured: only those
    // whose Staging allows it (the device kernels) are accepted, their
    // fences are never queried (a query would break the capture), and the
    // worker queues their kernels on the communication stream, which the
    // capture takes in through the issue's event.
    bool callerCapturing() const;

    // Worker thread: waits, until `deadline`, for the work queued on its
    // current stream (the op's, set by beforeCore) so far (`what` names it
    // in errors), calling `watch` about every millisecond meanwhile
    // (evidence checks).
    Status drain(Deadline deadline, const char* what, const std::function<void()>& watch = {});

    // Worker thread, around each device-window call outside a capture: the
    // calls must run in call order, and a synchronous one goes on its
    // caller's stream. followPreviousCall makes `stream` wait for the
    // previous call when that was queued on another stream (kUnavailable
    // when that was a caller's call whose stream is being captured now:
    // complete the calls in flight, which ends it, and ask again);
    // callQueued notes the call just queued on `stream`.
    Status followPreviousCall(cudaStream_t stream);
    void callQueued(cudaStream_t stream);

    // The calling thread, while the worker runs no op (MooncakeBackend's
    // caller launch, which excludes it): the stream the last device-window
    // call went on (null before the first), and, for a call the caller has
    // just queued on `stream` itself, its fence, which then is the last
    // call's, as callQueued makes a worker's. That fence records no event:
    // it completes when the worker marks it ended (DeviceFence::markEnded),
    // and another stream ordered after it waits on an event recorded on
    // `stream` only then (CallEndFence).
    cudaStream_t lastCallStream() const { return last_call_stream_; }
    std::shared_ptr<DeviceFence> callerCallFence(cudaStream_t stream);

    std::shared_ptr<DeviceOp> issue(Staging staging) override;
    Status beforeCore(DeviceOp& op, Deadline deadline) override;
    Status finish(const std::shared_ptr<DeviceOp>& op, bool ok) override;

    Status awaitInputs(DeviceOp& op, Deadline deadline,
                       const std::atomic<bool>* cancel = nullptr) override;

    // A fence for device work the executor does not queue itself (the P2P
    // copies on device pools, cuda_p2p.cc), on `stream`. Until armFence
    // records its event there (after that work), it reads as complete.
    std::shared_ptr<DeviceFence> fenceOn(cudaStream_t stream);
    // `fence` must come from fenceOn.
    static Status armFence(DeviceFence& fence);

    class EventPool;

private:
    class Fence;
    class CallEndFence;
    class Op;
    // Drops the ops whose fences have completed (their tensors go with them).
    void reap();
    // Moves those ops into `done` (retired_mu_ held). The caller drops them
    // after unlocking: dropping a tensor Python also holds may take the GIL,
    // and a thread holding the GIL may be waiting for retired_mu_.
    void takeFinishedLocked(std::vector<std::shared_ptr<DeviceOp>>* done);

    const c10::Device device_;
    const CudaPath path_;
    // The ops' events, reused (shared with fences that outlive the executor).
    const std::shared_ptr<EventPool> events_;
    cudaStream_t raw_stream_ = nullptr;
    c10::cuda::CUDAStream stream_;
    std::mutex ready_mu_;  // guards ready_'s record-then-wait
    cudaEvent_t ready_ = nullptr;
    cudaEvent_t drained_ = nullptr;  // worker thread only (drain)
    // Worker thread only: the fence of the op it runs (beforeCore), and the
    // last device-window call's stream and fence (its op's, recorded after
    // its work; or, for a call its caller launched, last_caller_fence_
    // instead), which the next call on another stream waits for.
    std::shared_ptr<Fence> running_fence_;
    cudaStream_t last_call_stream_ = nullptr;
    std::shared_ptr<Fence> last_call_fence_;
    std::shared_ptr<CallEndFence> last_caller_fence_;
    std::mutex retired_mu_;
    // Finished ops whose device work may still be running, oldest first.
    std::deque<std::shared_ptr<DeviceOp>> retired_;
};

}  // namespace mooncake::pg
