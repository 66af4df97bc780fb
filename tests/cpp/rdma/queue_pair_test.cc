// The RC state-transition table: each step's attribute mask holds exactly the
// attributes the IB spec requires for that step (IBTA 1.4, table 91, written
// out here independently of queue_pair.cc), and every attribute the step
// fills in is covered by its mask.
#include <infiniband/verbs.h>

#include <cstring>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/queue_pair.h"

namespace mooncake::te::rdma {
namespace {

TEST(QueuePairSteps, MasksAreTheSpecRequiredAttributes) {
    EXPECT_EQ(qpStepMask(QpStep::kInit), 0x1 | 0x10 | 0x20 | 0x8);  // STATE PKEY PORT ACCESS
    EXPECT_EQ(qpStepMask(QpStep::kInit),
              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    EXPECT_EQ(qpStepMask(QpStep::kReadyToReceive),
              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    EXPECT_EQ(qpStepMask(QpStep::kReadyToSend), IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                                    IBV_QP_MAX_QP_RD_ATOMIC);
    EXPECT_EQ(qpStepMask(QpStep::kError), IBV_QP_STATE);
    EXPECT_STREQ(qpStepName(QpStep::kReadyToReceive), "INIT->RTR");
}

QpAddress remoteRoce() {
    QpAddress r;
    for (int i = 0; i < 16; ++i)
        r.gid[i] = static_cast<uint8_t>(i + 1);
    r.lid = 0;
    r.qpn = 0x00abcdef;
    r.psn = 0x123456;
    r.mtu = IBV_MTU_4096;
    return r;
}

TEST(QueuePairSteps, InitAttributes) {
    QpLocal local;
    local.port = 2;
    ibv_qp_attr a = qpStepAttributes(QpStep::kInit, local, QpAddress{});
    EXPECT_EQ(a.qp_state, IBV_QPS_INIT);
    EXPECT_EQ(a.port_num, 2);
    EXPECT_EQ(a.pkey_index, 0);
    EXPECT_EQ(a.qp_access_flags,
              static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
}

TEST(QueuePairSteps, ReadyToReceiveOverRoceUsesTheGid) {
    QpLocal local;
    local.port = 1;
    local.gid_index = 3;
    local.mtu = IBV_MTU_1024;
    const QpAddress remote = remoteRoce();
    ibv_qp_attr a = qpStepAttributes(QpStep::kReadyToReceive, local, remote);
    EXPECT_EQ(a.qp_state, IBV_QPS_RTR);
    EXPECT_EQ(a.path_mtu, IBV_MTU_1024);  // the smaller end
    EXPECT_EQ(a.dest_qp_num, 0x00abcdefu);
    EXPECT_EQ(a.rq_psn, 0x123456u);
    EXPECT_EQ(a.max_dest_rd_atomic, local.max_rd_atomic);
    EXPECT_EQ(a.min_rnr_timer, local.min_rnr_timer);
    EXPECT_EQ(a.ah_attr.port_num, 1);
    EXPECT_EQ(a.ah_attr.is_global, 1);
    EXPECT_EQ(a.ah_attr.grh.sgid_index, 3);
    EXPECT_EQ(0, std::memcmp(a.ah_attr.grh.dgid.raw, remote.gid, 16));
    EXPECT_EQ(a.ah_attr.grh.hop_limit, 255);
}

TEST(QueuePairSteps, ReadyToReceiveOverInfinibandUsesTheLid) {
    QpLocal local;
    local.mtu = IBV_MTU_4096;
    QpAddress remote = remoteRoce();
    // An InfiniBand port's GID (fe80::/64 + GUID) is not zero either.
    remote.gid[0] = 0xfe;
    remote.gid[1] = 0x80;
    remote.lid = 0x1234;
    remote.mtu = IBV_MTU_2048;
    ibv_qp_attr a = qpStepAttributes(QpStep::kReadyToReceive, local, remote);
    EXPECT_EQ(a.ah_attr.is_global, 0);
    EXPECT_EQ(a.ah_attr.dlid, 0x1234);
    EXPECT_EQ(a.path_mtu, IBV_MTU_2048);
}

TEST(QueuePairSteps, ReadyToSendAttributes) {
    QpLocal local;
    local.sq_psn = 0x00fffffe;
    ibv_qp_attr a = qpStepAttributes(QpStep::kReadyToSend, local, remoteRoce());
    EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(a.sq_psn, 0x00fffffeu);
    EXPECT_EQ(a.timeout, local.timeout);
    EXPECT_EQ(a.retry_cnt, local.retry_cnt);
    EXPECT_EQ(a.rnr_retry, local.rnr_retry);
    EXPECT_EQ(a.max_rd_atomic, local.max_rd_atomic);
    EXPECT_EQ(qpStepAttributes(QpStep::kError, local, QpAddress{}).qp_state, IBV_QPS_ERR);
}

// Every field a step sets must be named in its mask, or the driver ignores it.
TEST(QueuePairSteps, EveryFieldSetIsInTheMask) {
    struct Field {
        int bit;
        bool (*set)(const ibv_qp_attr&);
    };
    const Field fields[] = {
        {IBV_QP_STATE, [](const ibv_qp_attr& a) { return a.qp_state != IBV_QPS_RESET; }},
        {IBV_QP_PORT, [](const ibv_qp_attr& a) { return a.port_num != 0; }},
        {IBV_QP_ACCESS_FLAGS, [](const ibv_qp_attr& a) { return a.qp_access_flags != 0; }},
        {IBV_QP_AV, [](const ibv_qp_attr& a) { return a.ah_attr.port_num != 0; }},
        {IBV_QP_PATH_MTU, [](const ibv_qp_attr& a) { return a.path_mtu != 0; }},
        {IBV_QP_DEST_QPN, [](const ibv_qp_attr& a) { return a.dest_qp_num != 0; }},
        {IBV_QP_RQ_PSN, [](const ibv_qp_attr& a) { return a.rq_psn != 0; }},
        {IBV_QP_MAX_DEST_RD_ATOMIC, [](const ibv_qp_attr& a) { return a.max_dest_rd_atomic != 0; }},
        {IBV_QP_MIN_RNR_TIMER, [](const ibv_qp_attr& a) { return a.min_rnr_timer != 0; }},
        {IBV_QP_TIMEOUT, [](const ibv_qp_attr& a) { return a.timeout != 0; }},
        {IBV_QP_RETRY_CNT, [](const ibv_qp_attr& a) { return a.retry_cnt != 0; }},
        {IBV_QP_RNR_RETRY, [](const ibv_qp_attr& a) { return a.rnr_retry != 0; }},
        {IBV_QP_SQ_PSN, [](const ibv_qp_attr& a) { return a.sq_psn != 0; }},
        {IBV_QP_MAX_QP_RD_ATOMIC, [](const ibv_qp_attr& a) { return a.max_rd_atomic != 0; }},
    };
    QpLocal local;
    local.sq_psn = 77;
    for (QpStep step :
         {QpStep::kInit, QpStep::kReadyToReceive, QpStep::kReadyToSend, QpStep::kError}) {
        const ibv_qp_attr a = qpStepAttributes(step, local, remoteRoce());
        for (const Field& f : fields) {
            if (f.set(a)) {
                EXPECT_NE(qpStepMask(step) & f.bit, 0)
                    << qpStepName(step) << " sets attribute bit " << f.bit << " without masking it";
            }
        }
    }
}

}  // namespace
}  // namespace mooncake::te::rdma
