// What MooncakeBackend's worker thread runs (backend.h, backend_worker.cc):
// a queued op, and a kernel call it queued on the communication stream but
// has not completed yet (cuda_pipeline.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "mooncake-pg/torch/executor.h"
#include "mooncake-pg/torch/work.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

// A collective's core calls, run on the worker thread. A non-OK Status
// comes from the Communicator (its lastFailure() names the ranks).
using CoreOp = std::function<Status(Deadline)>;
// Whether an op's buffers hold one block per rank of the group at issue
// (WorkerTask::group_size): such an op fails if the group grew since, and a
// rank outside that group (a reserved slot) has no block to touch.
enum class GroupSized {
    kNo,
    kBlocks,  // skipped on a rank outside the group: it has no block
    kRooted,  // gather/scatter: still run there (local-only) for the root's list
};
struct WorkerTask {
    c10::intrusive_ptr<MooncakeWork> work;
    const char* op_name;
    std::chrono::milliseconds timeout;
    CoreOp run;
    // The committed group size when the op was issued: buffers sized by
    // it cannot hold the blocks of a larger group.
    int group_size = 0;
    GroupSized sized = GroupSized::kNo;
    // The executor of the op's device and what it issued for the op.
    Executor* executor = nullptr;
    std::shared_ptr<DeviceOp> device_op;
    // Routed to the device kernels: it may queue behind kernel calls
    // still in flight instead of waiting for them (cuda_pipeline.cc).
    bool kernel_call = false;
    std::chrono::steady_clock::time_point enqueued;
    std::chrono::steady_clock::time_point taken;  // by the worker
};
// What runKernelCall queued, for runTask to put in flight.
struct KernelLaunch {
    int slot = 0;            // its result slot in the group window
    int size = 0;            // the applied view's size at launch
    uint64_t epoch = 0;      // applied_epoch_ at launch
    int64_t timeout_ns = 0;  // the kernels' own deadline, from their start
};
// A kernel call queued on the communication stream whose Work is not
// complete yet: the worker completes it once its fence has completed,
// from its result slot (cuda_pipeline.cc).
struct KernelInFlight {
    c10::intrusive_ptr<MooncakeWork> work;
    const char* op_name = "";
    std::chrono::milliseconds timeout{0};
    Deadline deadline = Deadline::never();  // the op's, for evidence reporting
    std::shared_ptr<DeviceFence> fence;
    KernelLaunch launch;
    // Armed when the call becomes the oldest in flight (its kernels run
    // from about then): its kernel deadline plus a grace.
    bool front = false;
    Deadline host_deadline = Deadline::never();
    bool abort_sent = false;
};

}  // namespace mooncake::pg
