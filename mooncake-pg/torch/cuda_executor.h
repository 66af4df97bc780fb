// CudaExecutor: the executor of a group's CUDA ops (executor.h).
//
// One communication stream per group. At issue, on the caller's thread, the
// stream waits (event) on the caller's current stream, so the op reads its
// inputs after the caller's prior work, and the inputs are copied into the
// op's pinned host mirrors (Staging) on it. The worker runs the core op on
// the mirrors once those copies have completed, then queues the copies back
// into the user's tensors on the stream and records the op's fence (a CUDA
// event) after them. Work::wait() makes the caller's current stream wait on
// the fence; the user's tensors and the mirrors are held until the fence
// has completed.
//
// That host staging is the interim data path of every collective (see
// docs/design/pg-cuda.md): route() is where device kernels over IPC-mapped
// windows (mooncake-pg/device/) replace it, one decision per collective.
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <memory>
#include <mutex>

#include <c10/cuda/CUDAStream.h>

#include "mooncake-pg/torch/executor.h"

namespace mooncake::pg {

// How a collective's data moves on CUDA tensors.
enum class CudaRoute {
    kHostStaging,  // device -> pinned host, the host core, host -> device
    kKernel,       // a device kernel over the members' mapped windows
};

// The collectives a route is chosen for.
enum class CudaCollective {
    kAllReduce,
    kAllGather,
    kReduceScatter,
    kAllToAll,
    kBroadcast,
    kReduce,
    kGather,
    kScatter,
};

class CudaExecutor final : public Executor {
public:
    // Creates the communication stream on `device`; throws c10::Error when
    // CUDA is unusable there.
    explicit CudaExecutor(c10::Device device);
    ~CudaExecutor() override;

    c10::Device device() const { return device_; }
    c10::cuda::CUDAStream stream() const { return stream_; }

    // One function per collective: which path an op of `bytes` per rank
    // takes. Every collective takes kHostStaging until its kernel lands.
    CudaRoute route(CudaCollective collective, size_t bytes) const;

    std::shared_ptr<DeviceOp> issue(Staging staging) override;
    Status beforeCore(DeviceOp& op, Deadline deadline) override;
    Status finish(const std::shared_ptr<DeviceOp>& op, bool ok) override;

    Status awaitInputs(DeviceOp& op, Deadline deadline) override;

private:
    class Op;
    // Drops the ops whose fences have completed (their tensors go with them).
    void reap();
    void reapLocked();  // retired_mu_ held

    const c10::Device device_;
    cudaStream_t raw_stream_ = nullptr;
    c10::cuda::CUDAStream stream_;
    std::mutex ready_mu_;  // guards ready_'s record-then-wait
    cudaEvent_t ready_ = nullptr;
    std::mutex retired_mu_;
    // Finished ops whose device work may still be running, oldest first.
    std::deque<std::shared_ptr<DeviceOp>> retired_;
};

}  // namespace mooncake::pg
