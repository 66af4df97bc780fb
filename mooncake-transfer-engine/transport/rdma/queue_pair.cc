#include "mooncake-transfer-engine/transport/rdma/queue_pair.h"

#include <cerrno>
#include <cstring>

#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"

namespace mooncake::te::rdma {

namespace {

// The attribute masks of the RC transitions (IBTA 1.4, table 91 "QP state
// transition properties": required attributes of each step; optional ones
// are not set, so the driver keeps its defaults).
struct StepRow {
    QpStep step;
    const char* name;
    int mask;
};
constexpr StepRow kSteps[] = {
    {QpStep::kInit, "RESET->INIT",
     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {QpStep::kReadyToReceive, "INIT->RTR",
     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER},
    {QpStep::kReadyToSend, "RTR->RTS",
     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
         IBV_QP_MAX_QP_RD_ATOMIC},
    {QpStep::kError, "->ERROR", IBV_QP_STATE},
};

const StepRow& row(QpStep step) {
    for (const StepRow& r : kSteps) {
        if (r.step == step)
            return r;
    }
    return kSteps[3];
}

bool isZeroGid(const uint8_t* gid) {
    for (int i = 0; i < 16; ++i) {
        if (gid[i])
            return false;
    }
    return true;
}

}  // namespace

const char* qpStepName(QpStep step) {
    return row(step).name;
}
int qpStepMask(QpStep step) {
    return row(step).mask;
}

ibv_qp_attr qpStepAttributes(QpStep step, const QpLocal& local, const QpAddress& remote) {
    ibv_qp_attr a;
    std::memset(&a, 0, sizeof(a));
    switch (step) {
        case QpStep::kInit:
            a.qp_state = IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = local.port;
            a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            break;
        case QpStep::kReadyToReceive:
            a.qp_state = IBV_QPS_RTR;
            a.path_mtu = static_cast<ibv_mtu>(local.mtu < remote.mtu ? local.mtu : remote.mtu);
            a.dest_qp_num = remote.qpn;
            a.rq_psn = remote.psn;
            a.max_dest_rd_atomic = local.max_rd_atomic;
            a.min_rnr_timer = local.min_rnr_timer;
            a.ah_attr.port_num = local.port;
            a.ah_attr.dlid = remote.lid;
            // RoCE has no LIDs: address by GID through the GRH. InfiniBand
            // peers in one subnet are addressed by LID.
            if (remote.lid == 0 && !isZeroGid(remote.gid)) {
                a.ah_attr.is_global = 1;
                std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
                a.ah_attr.grh.sgid_index = local.gid_index;
                a.ah_attr.grh.hop_limit = 255;
            }
            break;
        case QpStep::kReadyToSend:
            a.qp_state = IBV_QPS_RTS;
            a.timeout = local.timeout;
            a.retry_cnt = local.retry_cnt;
            a.rnr_retry = local.rnr_retry;
            a.sq_psn = local.sq_psn;
            a.max_rd_atomic = local.max_rd_atomic;
            break;
        case QpStep::kError:
            a.qp_state = IBV_QPS_ERR;
            break;
    }
    return a;
}

QpLocal qpLocalFor(const RdmaDevice& device) {
    QpLocal local;
    local.port = device.endpoint().port;
    local.gid_index = device.endpoint().gid_index;
    local.mtu = device.endpoint().mtu;
    local.max_rd_atomic = device.maxRdAtomic();
    return local;
}

QpAddress qpAddressOf(const RdmaDevice& device, uint32_t qpn, uint32_t psn) {
    QpAddress a;
    std::memcpy(a.gid, device.endpoint().gid, sizeof(a.gid));
    a.lid = device.endpoint().lid;
    a.qpn = qpn;
    a.psn = psn;
    a.mtu = device.endpoint().mtu;
    return a;
}

Result<std::unique_ptr<QueuePair>> QueuePair::create(const VerbsApi& api, ibv_pd* pd, ibv_cq* cq,
                                                     uint32_t max_send_wr,
                                                     const std::string& what) {
    ibv_qp_init_attr init;
    std::memset(&init, 0, sizeof(init));
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = max_send_wr;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    errno = 0;
    ibv_qp* qp = api.createQp(pd, &init);
    if (!qp)
        return verbsError("ibv_create_qp", errno ? errno : ENOMEM, what);
    return std::unique_ptr<QueuePair>(new QueuePair(api, qp, what));
}

QueuePair::~QueuePair() {
    if (qp_)
        (void)api_.destroyQp(qp_);
}

Status QueuePair::step(QpStep s, const QpLocal& local, const QpAddress& remote) {
    ibv_qp_attr attr = qpStepAttributes(s, local, remote);
    // ibv_modify_qp returns the errno value instead of setting errno.
    const int rc = api_.modifyQp(qp_, &attr, qpStepMask(s));
    if (rc != 0)
        return verbsError(std::string("ibv_modify_qp(") + qpStepName(s) + ")", rc, what_);
    return Status::OK();
}

Status QueuePair::connect(const QpLocal& local, const QpAddress& remote) {
    MC_RETURN_IF_ERROR(step(QpStep::kInit, local, remote));
    MC_RETURN_IF_ERROR(step(QpStep::kReadyToReceive, local, remote));
    return step(QpStep::kReadyToSend, local, remote);
}

void QueuePair::fail() {
    (void)step(QpStep::kError, QpLocal{}, QpAddress{});
}

}  // namespace mooncake::te::rdma
