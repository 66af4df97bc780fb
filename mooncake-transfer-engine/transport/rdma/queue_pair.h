// RC queue pairs: the RESET → INIT → RTR → RTS transitions as one table of
// attribute masks (queue_pair.cc), the attributes each step sets, and an
// owning QueuePair that walks them. Building the attributes is pure so the
// tests check every mask and field without a device.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"
#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma {

class RdmaDevice;

enum class QpStep { kInit, kReadyToReceive, kReadyToSend, kError };

const char* qpStepName(QpStep step);
// The attribute mask ibv_modify_qp gets for `step` (the table).
int qpStepMask(QpStep step);

// What the local side contributes to the transitions.
struct QpLocal {
    uint8_t port = 1;
    uint8_t gid_index = 0;
    uint8_t mtu = IBV_MTU_1024;  // enum ibv_mtu; the smaller of both ends
    uint32_t sq_psn = 0;
    uint8_t max_rd_atomic = 16;  // READs/atomics in flight, both directions
    uint8_t timeout = 14;        // 4.096 us * 2^14 = 67 ms per try
    uint8_t retry_cnt = 7;
    uint8_t rnr_retry = 7;
    uint8_t min_rnr_timer = 12;
};

// What `device` contributes: its port, GID index and MTU, and the READs and
// atomics it can have in flight.
QpLocal qpLocalFor(const RdmaDevice& device);
// How a peer addresses QP `qpn` of `device`.
QpAddress qpAddressOf(const RdmaDevice& device, uint32_t qpn, uint32_t psn = 0);

// The attributes for `step` towards `remote` (only INIT→RTR reads it).
// RoCE peers (LID 0) are addressed by GID through the GRH; InfiniBand
// peers by LID.
ibv_qp_attr qpStepAttributes(QpStep step, const QpLocal& local, const QpAddress& remote);

// An RC QP with its send CQ; destroyed with its owner.
class QueuePair {
public:
    static Result<std::unique_ptr<QueuePair>> create(const VerbsApi& api, ibv_pd* pd, ibv_cq* cq,
                                                     uint32_t max_send_wr, const std::string& what);
    ~QueuePair();
    QueuePair(const QueuePair&) = delete;
    QueuePair& operator=(const QueuePair&) = delete;

    // INIT, RTR and RTS in order; the first failing step names itself.
    Status connect(const QpLocal& local, const QpAddress& remote);
    // Moves to ERROR so every posted request completes (flushed).
    void fail();
    uint32_t qpn() const { return qp_->qp_num; }
    ibv_qp* raw() const { return qp_; }

private:
    QueuePair(const VerbsApi& api, ibv_qp* qp, std::string what)
        : api_(api), qp_(qp), what_(std::move(what)) {}
    Status step(QpStep step, const QpLocal& local, const QpAddress& remote);

    const VerbsApi& api_;
    ibv_qp* qp_;
    std::string what_;
};

}  // namespace mooncake::te::rdma
