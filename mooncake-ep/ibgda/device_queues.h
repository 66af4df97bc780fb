// An IBGDA queue pair as a kernel sees it: the queues and doorbell records
// (host memory the provider allocated) pinned and mapped into the GPU's
// address space, the doorbell register mapped as I/O memory, and the
// producer's and consumer's views rewritten with device addresses. Kernels
// then post and reap with mlx5_queues.h. Unmapped when destroyed, which must
// come after every kernel using it and before the queue pair.
// Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"

namespace mooncake::ep {

class IbgdaDeviceQueues {
public:
    // Maps `qp`'s ranges on the current device. Pages other queue pairs
    // share are pinned once for all (pinned_pages.h); pages registered by
    // someone else are used as they are and left registered.
    static Result<std::unique_ptr<IbgdaDeviceQueues>> map(const te::rdma::IbgdaQueuePair& qp);
    ~IbgdaDeviceQueues();
    IbgdaDeviceQueues(const IbgdaDeviceQueues&) = delete;
    IbgdaDeviceQueues& operator=(const IbgdaDeviceQueues&) = delete;

    // Device addresses; the counters are the queue pair's at mapping time.
    const te::rdma::mlx5::SendQueue& sendQueue() const { return sq_; }
    const te::rdma::mlx5::CompletionQueue& completionQueue() const { return cq_; }

private:
    IbgdaDeviceQueues() = default;

    std::vector<uintptr_t> held_;  // the registrations it holds (processPinnedPages)
    te::rdma::mlx5::SendQueue sq_;
    te::rdma::mlx5::CompletionQueue cq_;
};

}  // namespace mooncake::ep
