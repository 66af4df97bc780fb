// Executor: the device side of an op, under the device-agnostic c10d adapter
// (MooncakeBackend: argument checks, Work, the ordered worker queue, one
// membership driver). The adapter runs every collective's core call on its
// worker thread, in issue order, against the applied membership view;
// an executor brackets that call for the op's device:
//
//   caller's thread   issue():    order the op after the caller's prior work
//                                 and start moving inputs where the core
//                                 reads them;
//   worker thread     beforeCore: wait (with the op's deadline) until they
//                                 are there;
//                     <the core op, or a device kernel chosen by route()>
//                     finish():   move outputs back, in stream order, and
//                                 arm the fence the op's Work completes with.
//
// CpuExecutor: host tensors, nothing to move, no fence (Work::wait blocks the
// CPU). CudaExecutor (cuda_executor.h): a communication stream per group.
#pragma once

#include <atomic>

#include <memory>
#include <vector>

#include "mooncake-pg/torch/staging.h"
#include "mooncake-pg/torch/work.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

// One issued op's device state; what an executor keeps between its calls.
class DeviceOp {
public:
    virtual ~DeviceOp() = default;
    // The fence the op's Work waits on (null for host-only ops).
    virtual std::shared_ptr<DeviceFence> fence() const { return nullptr; }
    // The devices the Work's Future is completed on (empty: CPU).
    virtual std::vector<c10::Device> devices() const { return {}; }
};

class Executor {
public:
    virtual ~Executor() = default;
    // Caller's thread, after every argument check: takes over `staging`.
    virtual std::shared_ptr<DeviceOp> issue(Staging staging) = 0;
    // Any thread: waits (until `deadline`, or kAborted once `*cancel` is
    // raised) for the op's inputs to be where the core reads them (a send
    // posts its data only then).
    virtual Status awaitInputs(DeviceOp& op, Deadline deadline,
                               const std::atomic<bool>* cancel = nullptr) = 0;
    // Worker thread, before the core call: awaitInputs, and sets up the
    // thread for the op's completion.
    virtual Status beforeCore(DeviceOp& op, Deadline deadline) = 0;
    // Worker thread (the P2P progress thread for a recv), after the core
    // call, or instead of it when it was not run; `ok`: the core wrote the
    // outputs, so they are copied back. Never throws: a non-OK status fails
    // the op.
    virtual Status finish(const std::shared_ptr<DeviceOp>& op, bool ok) = 0;
};

// Host tensors: the core reads and writes the user's tensors directly.
class CpuExecutor final : public Executor {
public:
    std::shared_ptr<DeviceOp> issue(Staging) override { return std::make_shared<DeviceOp>(); }
    Status awaitInputs(DeviceOp&, Deadline, const std::atomic<bool>*) override {
        return Status::OK();
    }
    Status beforeCore(DeviceOp&, Deadline) override { return Status::OK(); }
    Status finish(const std::shared_ptr<DeviceOp>&, bool) override { return Status::OK(); }
};

}  // namespace mooncake::pg
