// An RC queue pair a GPU drives (IBGDA): created through verbs like any
// other, then its send queue, completion queue, doorbell records and
// doorbell register located through mlx5 direct verbs (mlx5dv_init_obj), so
// that mlx5_queues.h can post to it and reap it from a kernel once those
// ranges are mapped into the GPU's address space (ranges(): the queues and
// records as pinned host memory, the doorbell register as I/O memory). The
// queues stay where the provider put them (host memory); placing them in GPU
// memory (DEVX umem) is not done. Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"
#include "mooncake-transfer-engine/transport/rdma/queue_pair.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"

namespace mooncake::te::rdma {

// The mlx5 direct-verbs calls IBGDA needs, loaded at run time like verbs.
struct Mlx5DirectApi {
    decltype(&::mlx5dv_is_supported) isSupported = nullptr;
    decltype(&::mlx5dv_init_obj) initObject = nullptr;

    // From `library` ("" = $MC_RDMA_MLX5_LIBRARY, else libmlx5.so.1), kept
    // loaded for the process;
    // kUnavailable naming what is missing.
    static Result<Mlx5DirectApi> load(const std::string& library);
};

class IbgdaQueuePair {
public:
    // A CQ and an RC QP with room for `wqes` send WQEs (a power of two, at
    // most kMaxSendQueueWqes) on `device`. Fails, naming the cause, when the
    // provider's queues do not fit what the kernels assume (64-byte WQEs and
    // CQEs, a CQ at least as large as the send queue).
    static Result<std::unique_ptr<IbgdaQueuePair>> create(RdmaDevice& device,
                                                          const Mlx5DirectApi& dv, uint32_t wqes);
    ~IbgdaQueuePair();
    IbgdaQueuePair(const IbgdaQueuePair&) = delete;
    IbgdaQueuePair& operator=(const IbgdaQueuePair&) = delete;

    uint32_t qpn() const { return qp_->qpn(); }
    // INIT, RTR and RTS towards `remote`.
    Status connect(const QpLocal& local, const QpAddress& remote) {
        return qp_->connect(local, remote);
    }
    // Moves the QP to ERROR: what is posted completes flushed.
    void fail() { qp_->fail(); }

    // The producer's and the consumer's views, at host addresses. Each has a
    // single user at a time (one GPU thread, say).
    const mlx5::SendQueue& sendQueue() const { return sq_; }
    const mlx5::CompletionQueue& completionQueue() const { return cq_; }

    // What a GPU must map to drive the queues: `io` marks the doorbell
    // register (cudaHostRegisterIoMemory), the rest is ordinary host memory.
    struct Range {
        void* addr;
        size_t bytes;
        bool io;
    };
    std::vector<Range> ranges() const;

private:
    IbgdaQueuePair(const VerbsApi& api, ibv_cq* cq) : api_(api), cq_raw_(cq) {}

    const VerbsApi& api_;
    ibv_cq* cq_raw_;
    std::unique_ptr<QueuePair> qp_;
    mlx5::SendQueue sq_;
    mlx5::CompletionQueue cq_;
    uint32_t doorbell_bytes_ = 0;
};

}  // namespace mooncake::te::rdma
