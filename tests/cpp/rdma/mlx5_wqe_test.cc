// The IBGDA WQE encoder against rdma-core's own description of the layout:
// <infiniband/mlx5dv.h>'s segment structs, constants and inline setters are
// the reference; the encoder never includes that header.
#include <endian.h>
#include <infiniband/mlx5dv.h>

#include <cstddef>
#include <cstring>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"
#include "mooncake-transfer-engine/transport/rdma/mlx5_wqe.h"

namespace mooncake::te::rdma::mlx5 {
namespace {

TEST(Mlx5Wqe, ConstantsMatchMlx5dv) {
    EXPECT_EQ(kOpcodeRdmaWrite, MLX5_OPCODE_RDMA_WRITE);
    EXPECT_EQ(kOpcodeRdmaRead, MLX5_OPCODE_RDMA_READ);
    EXPECT_EQ(kOpcodeAtomicFetchAdd, MLX5_OPCODE_ATOMIC_FA);
    EXPECT_EQ(kCtrlCqUpdate, MLX5_WQE_CTRL_CQ_UPDATE);
    EXPECT_EQ(kCtrlSolicited, MLX5_WQE_CTRL_SOLICITED);
    EXPECT_EQ(kCtrlFence, MLX5_WQE_CTRL_FENCE);
    EXPECT_EQ(kCtrlSmallFence, MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE);
    EXPECT_EQ(kBasicBlockBytes, static_cast<uint32_t>(MLX5_SEND_WQE_BB));
    EXPECT_EQ(kSendDoorbellIndex, MLX5_SND_DBR);
    EXPECT_EQ(kSegmentBytes, sizeof(mlx5_wqe_ctrl_seg));
    EXPECT_EQ(kSegmentBytes, sizeof(mlx5_wqe_raddr_seg));
    EXPECT_EQ(kSegmentBytes, sizeof(mlx5_wqe_data_seg));
    EXPECT_EQ(kSegmentBytes, sizeof(mlx5_wqe_atomic_seg));
}

TEST(Mlx5Wqe, ByteSwapsAreBigEndian) {
    EXPECT_EQ(toBig32(0x01020304u), htobe32(0x01020304u));
    EXPECT_EQ(toBig64(0x0102030405060708ull), htobe64(0x0102030405060708ull));
}

// Every field a control segment can carry, at its extremes and in between.
TEST(Mlx5Wqe, ControlSegmentMatchesMlx5dvSetter) {
    const uint16_t indexes[] = {0, 1, 0x1234, 0xffff};
    const uint32_t qpns[] = {1, 0x00abcdef, 0x00ffffff};
    const uint8_t flags[] = {0, kCtrlCqUpdate, kCtrlFence | kCtrlCqUpdate, kCtrlSolicited};
    for (uint16_t pi : indexes) {
        for (uint32_t qpn : qpns) {
            for (uint8_t f : flags) {
                for (uint8_t ds : {uint8_t{1}, uint8_t{3}, uint8_t{4}, uint8_t{63}}) {
                    alignas(16) mlx5_wqe_ctrl_seg expected;
                    std::memset(&expected, 0, sizeof(expected));
                    mlx5dv_set_ctrl_seg(&expected, pi, MLX5_OPCODE_RDMA_WRITE, 0x5a, qpn, f, ds, 0,
                                        0);
                    alignas(16) unsigned char got[16];
                    std::memset(got, 0xee, sizeof(got));
                    writeControlSegment(got, pi, kOpcodeRdmaWrite, 0x5a, qpn, ds, f);
                    ASSERT_EQ(0, std::memcmp(got, &expected, 16))
                        << "pi=" << pi << " qpn=" << qpn << " flags=" << int(f)
                        << " ds=" << int(ds);
                }
            }
        }
    }
}

TEST(Mlx5Wqe, ControlSegmentFieldOffsets) {
    alignas(16) unsigned char got[16];
    writeControlSegment(got, 0x0102, 0x08, 0x03, 0x00aabbcc, 3, kCtrlCqUpdate | kCtrlFence);
    const auto* seg = reinterpret_cast<const mlx5_wqe_ctrl_seg*>(got);
    EXPECT_EQ(be32toh(seg->opmod_idx_opcode), (0x03u << 24) | (0x0102u << 8) | 0x08u);
    EXPECT_EQ(be32toh(seg->qpn_ds), (0x00aabbccu << 8) | 3u);
    EXPECT_EQ(seg->signature, 0);
    EXPECT_EQ(seg->dci_stream_channel_id, 0);
    EXPECT_EQ(seg->fm_ce_se, MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE);
    EXPECT_EQ(got[offsetof(mlx5_wqe_ctrl_seg, fm_ce_se)], 0x88);
    EXPECT_EQ(seg->imm, 0u);
}

TEST(Mlx5Wqe, RemoteAddressSegment) {
    alignas(16) unsigned char got[16];
    writeRemoteAddressSegment(got, 0x1122334455667788ull, 0xdeadbeef);
    mlx5_wqe_raddr_seg expected;
    expected.raddr = htobe64(0x1122334455667788ull);
    expected.rkey = htobe32(0xdeadbeef);
    expected.reserved = 0;
    EXPECT_EQ(0, std::memcmp(got, &expected, 16));
    const unsigned char bytes[16] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
                                     0xde, 0xad, 0xbe, 0xef, 0,    0,    0,    0};
    EXPECT_EQ(0, std::memcmp(got, bytes, 16));
}

TEST(Mlx5Wqe, DataSegmentMatchesMlx5dvSetter) {
    alignas(16) unsigned char got[16];
    writeDataSegment(got, 4096, 0x01020304, 0x00007f0012345678ull);
    mlx5_wqe_data_seg expected;
    mlx5dv_set_data_seg(&expected, 4096, 0x01020304, 0x00007f0012345678ull);
    EXPECT_EQ(0, std::memcmp(got, &expected, 16));
}

TEST(Mlx5Wqe, AtomicSegment) {
    alignas(16) unsigned char got[16];
    writeAtomicSegment(got, 0x0000000100000002ull, 0xfedcba9876543210ull);
    mlx5_wqe_atomic_seg expected;
    expected.swap_add = htobe64(0x0000000100000002ull);
    expected.compare = htobe64(0xfedcba9876543210ull);
    EXPECT_EQ(0, std::memcmp(got, &expected, 16));
}

// A whole WRITE WQE against one assembled from mlx5dv.h's pieces.
TEST(Mlx5Wqe, RdmaWriteWqe) {
    for (bool signaled : {false, true}) {
        for (bool fence : {false, true}) {
            WriteWqe w{
                0xbeef,   0x000123, 0x00007f00aa000040ull, 0x11, 0x00007f00bb000080ull, 0x22, 65536,
                signaled, fence};
            alignas(64) unsigned char got[64];
            std::memset(got, 0xcc, sizeof(got));
            EXPECT_EQ(encodeRdma(got, w), 1u);
            alignas(64) unsigned char expected[64] = {};
            auto* ctrl = reinterpret_cast<mlx5_wqe_ctrl_seg*>(expected);
            auto* raddr = reinterpret_cast<mlx5_wqe_raddr_seg*>(expected + 16);
            auto* data = reinterpret_cast<mlx5_wqe_data_seg*>(expected + 32);
            const uint8_t f =
                (signaled ? MLX5_WQE_CTRL_CQ_UPDATE : 0) | (fence ? MLX5_WQE_CTRL_FENCE : 0);
            mlx5dv_set_ctrl_seg(ctrl, 0xbeef, MLX5_OPCODE_RDMA_WRITE, 0, 0x000123, f, 3, 0, 0);
            raddr->raddr = htobe64(0x00007f00bb000080ull);
            raddr->rkey = htobe32(0x22);
            raddr->reserved = 0;
            mlx5dv_set_data_seg(data, 65536, 0x11, 0x00007f00aa000040ull);
            EXPECT_EQ(0, std::memcmp(got, expected, 64))
                << "signaled=" << signaled << " fence=" << fence;
        }
    }
}

TEST(Mlx5Wqe, RdmaReadWqeDiffersOnlyInOpcode) {
    WriteWqe w{7, 9, 0x1000, 1, 0x2000, 2, 8, true, false};
    alignas(64) unsigned char write[64], read[64];
    encodeRdma(write, w, kOpcodeRdmaWrite);
    encodeRdma(read, w, kOpcodeRdmaRead);
    EXPECT_EQ(read[3], MLX5_OPCODE_RDMA_READ);  // the opcode is the last big-endian byte
    read[3] = write[3];
    EXPECT_EQ(0, std::memcmp(write, read, 64));
}

TEST(Mlx5Wqe, FetchAddWqe) {
    FetchAddWqe a{0x0102, 0x00fedcba, 0x00007f0000001000ull, 0x33, 0x00007f0000002008ull, 0x44, 5,
                  true,   false};
    alignas(64) unsigned char got[64];
    std::memset(got, 0xcc, sizeof(got));
    EXPECT_EQ(encodeFetchAdd(got, a), 1u);
    alignas(64) unsigned char expected[64] = {};
    auto* ctrl = reinterpret_cast<mlx5_wqe_ctrl_seg*>(expected);
    auto* raddr = reinterpret_cast<mlx5_wqe_raddr_seg*>(expected + 16);
    auto* atomic = reinterpret_cast<mlx5_wqe_atomic_seg*>(expected + 32);
    auto* data = reinterpret_cast<mlx5_wqe_data_seg*>(expected + 48);
    mlx5dv_set_ctrl_seg(ctrl, 0x0102, MLX5_OPCODE_ATOMIC_FA, 0, 0x00fedcba, MLX5_WQE_CTRL_CQ_UPDATE,
                        4, 0, 0);
    raddr->raddr = htobe64(0x00007f0000002008ull);
    raddr->rkey = htobe32(0x44);
    raddr->reserved = 0;
    atomic->swap_add = htobe64(5);
    atomic->compare = 0;
    mlx5dv_set_data_seg(data, 8, 0x33, 0x00007f0000001000ull);
    EXPECT_EQ(0, std::memcmp(got, expected, 64));
}

TEST(Mlx5Wqe, DoorbellRecord) {
    uint32_t dbrec[2] = {0x11111111u, 0x22222222u};
    updateSendDoorbellRecord(dbrec, 0x12345);     // the record keeps 16 bits
    EXPECT_EQ(dbrec[MLX5_RCV_DBR], 0x11111111u);  // the receive counter is untouched
    EXPECT_EQ(dbrec[MLX5_SND_DBR], htobe32(0x2345u));
    const unsigned char* b = reinterpret_cast<const unsigned char*>(&dbrec[MLX5_SND_DBR]);
    EXPECT_EQ(b[0], 0x00);
    EXPECT_EQ(b[1], 0x00);
    EXPECT_EQ(b[2], 0x23);
    EXPECT_EQ(b[3], 0x45);
}

TEST(Mlx5Wqe, UarDoorbellWordIsTheFirstEightBytes) {
    alignas(64) unsigned char wqe[64];
    encodeRdma(wqe, WriteWqe{3, 0x42, 0, 1, 0, 2, 8, true, false});
    uint64_t expected;
    std::memcpy(&expected, wqe, 8);
    EXPECT_EQ(uarDoorbellWord(wqe), expected);
}

// Posters keep the doorbell word instead of reading the WQE back: it must be
// the head encodeRdma / encodeFetchAdd write, byte for byte.
TEST(Mlx5Wqe, ControlSegmentHeadIsWhatTheEncodersWrite) {
    alignas(64) unsigned char write[64], add[64];
    encodeRdma(write, WriteWqe{0xfffe, 0xabcdef, 0, 1, 0, 2, 8, false, true});
    FetchAddWqe a{};
    a.wqe_index = 0x1234;
    a.qpn = 0x10203;
    a.signaled = true;
    encodeFetchAdd(add, a);
    EXPECT_EQ(controlSegmentHead(0xfffe, kOpcodeRdmaWrite, 0, 0xabcdef, kRdmaWqeDs),
              uarDoorbellWord(write));
    EXPECT_EQ(controlSegmentHead(0x1234, kOpcodeAtomicFetchAdd, 0, 0x10203, kFetchAddWqeDs),
              uarDoorbellWord(add));
}

// The completion side (mlx5_queues.h) against mlx5dv.h's CQE structs.
TEST(Mlx5Cqe, LayoutMatchesMlx5dv) {
    EXPECT_EQ(kCqeBytes, sizeof(mlx5_cqe64));
    EXPECT_EQ(kCqeBytes, sizeof(mlx5_err_cqe));
    EXPECT_EQ(kCqeByteCountOffset, offsetof(mlx5_cqe64, byte_cnt));
    EXPECT_EQ(kCqeWqeCounterOffset, offsetof(mlx5_cqe64, wqe_counter));
    EXPECT_EQ(kCqeOpOwnOffset, offsetof(mlx5_cqe64, op_own));
    EXPECT_EQ(kCqeWqeCounterOffset, offsetof(mlx5_err_cqe, wqe_counter));
    EXPECT_EQ(kCqeOpOwnOffset, offsetof(mlx5_err_cqe, op_own));
    EXPECT_EQ(kCqeSyndromeOffset, offsetof(mlx5_err_cqe, syndrome));
    EXPECT_EQ(kCqeVendorSyndromeOffset, offsetof(mlx5_err_cqe, vendor_err_synd));
    EXPECT_EQ(kCqeRequester, MLX5_CQE_REQ);
    EXPECT_EQ(kCqeRequesterError, MLX5_CQE_REQ_ERR);
    EXPECT_EQ(kCqeResponderError, MLX5_CQE_RESP_ERR);
    EXPECT_EQ(kCqeInvalid, MLX5_CQE_INVALID);
    EXPECT_EQ(kSyndromeLocalLength, MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
    EXPECT_EQ(kSyndromeLocalQpOperation, MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
    EXPECT_EQ(kSyndromeLocalProtection, MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
    EXPECT_EQ(kSyndromeFlushed, MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
    EXPECT_EQ(kSyndromeRemoteAccess, MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
    EXPECT_EQ(kSyndromeRemoteOperation, MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
    EXPECT_EQ(kSyndromeRetryExceeded, MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
}

// A CQE written through mlx5dv.h's struct and accessors is read back by
// pollCompletion with its fields, in the pass its owner bit names only.
TEST(Mlx5Cqe, PollReadsWhatMlx5dvWrites) {
    alignas(64) mlx5_cqe64 ring[2];
    std::memset(ring, 0, sizeof(ring));
    for (auto& c : ring)
        c.op_own = MLX5_CQE_INVALID << 4;
    uint32_t dbrec = 0;
    CompletionQueue cq{reinterpret_cast<const unsigned char*>(ring), 2, &dbrec, 0};
    Completion got;
    EXPECT_FALSE(pollCompletion(cq, &got));
    ring[0].wqe_counter = htobe16(0xbeef);
    ring[0].op_own = MLX5_CQE_REQ << 4;
    mlx5dv_set_cqe_owner(&ring[0], 0);
    ASSERT_TRUE(pollCompletion(cq, &got));
    EXPECT_EQ(MLX5_CQE_REQ, got.opcode);
    EXPECT_EQ(0xbeef, got.wqe_counter);
    EXPECT_EQ(htobe32(1u), dbrec);
    auto* err = reinterpret_cast<mlx5_err_cqe*>(&ring[1]);
    err->syndrome = MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR;
    err->vendor_err_synd = 0x88;
    err->wqe_counter = htobe16(7);
    err->op_own = MLX5_CQE_REQ_ERR << 4;  // owner 0: the first pass
    ASSERT_TRUE(pollCompletion(cq, &got));
    EXPECT_TRUE(isError(got));
    EXPECT_EQ(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR, got.syndrome);
    EXPECT_EQ(0x88, got.vendor_syndrome);
    EXPECT_EQ(7, got.wqe_counter);
    // The second pass expects owner 1: slot 0 still holds a first-pass CQE.
    EXPECT_FALSE(pollCompletion(cq, &got));
    mlx5dv_set_cqe_owner(&ring[0], 1);
    ASSERT_TRUE(pollCompletion(cq, &got));
    EXPECT_EQ(htobe32(3u), dbrec);
}

}  // namespace
}  // namespace mooncake::te::rdma::mlx5
