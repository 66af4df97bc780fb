// The IBGDA send kernels end to end without a NIC: two ranks in one process,
// each with its EP buffer and staging in pinned host memory (the GPU and the
// software HCA address the same bytes), neither in the other's peer table,
// so every byte between them goes as RDMA WRITEs and fetch-adds that the
// kernels post into queues the software HCA executes from a host thread.
// Outputs are checked against the CPU reference over three iterations (both
// phases, and a phase reused: the shadows). Then a peer whose queues never
// execute: the sender marks it inactive at the deadline instead of hanging.
// Skipped, with the reason, without a GPU. (rdma_fake_verbs_test.cc runs the
// same rounds through IbgdaLink and the fake verbs provider.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "mooncake-ep/ibgda/ibgda_kernels.h"
#include "tests/cpp/ep/ibgda_two_ranks.h"
#include "tests/cpp/rdma/soft_hca.h"

namespace mooncake::ep {
namespace {

using namespace test;  // NOLINT: the reference's vocabulary
using te::rdma::soft::QueueMemory;
using te::rdma::soft::SoftHca;

constexpr int kQpsPerRank = 2;
constexpr uint32_t kWqes = 64;

class IbgdaKernels : public ::testing::Test {
protected:
    void SetUp() override {
        SKIP_WITHOUT_GPU();
        const int64_t staging_bytes = ibgdaStagingBytesFor(ibgdaTestBufferBytes(s));
        for (int r = 0; r < s.num_ranks; ++r) {
            ranks.push_back(std::make_unique<IbgdaTestRank>(s, r));
            ASSERT_TRUE(ranks.back()->ok);
            staging.push_back(std::make_unique<Pinned>(static_cast<size_t>(staging_bytes)));
            ASSERT_NE(nullptr, staging.back()->as<void>());
            buffer_keys.push_back(hca.registerMemory(ranks[r]->buffer, ibgdaTestBufferBytes(s)));
            devices.emplace_back();
            devices[r].staging = staging[r]->as<char>();
            devices[r].staging_bytes = static_cast<uint64_t>(staging_bytes);
            devices[r].staging_lkey = hca.registerMemory(staging[r]->as<void>(), staging_bytes);
            devices[r].qps_per_rank = kQpsPerRank;
        }
        for (int r = 0; r < s.num_ranks; ++r) {
            std::vector<IbgdaChannel> channels(s.num_ranks * kQpsPerRank);
            std::vector<uint64_t> bases;
            std::vector<uint32_t> keys;
            for (int p = 0; p < s.num_ranks; ++p) {
                bases.push_back(reinterpret_cast<uint64_t>(ranks[p]->buffer));
                keys.push_back(buffer_keys[p]);
                for (int q = 0; q < kQpsPerRank && p != r; ++q) {
                    // WQEs, CQEs, then the records and the doorbell.
                    queue_memory.push_back(std::make_unique<Pinned>(kWqes * 128 + 192));
                    unsigned char* m = queue_memory.back()->as<unsigned char>();
                    QueueMemory mem;
                    mem.wqes = m;
                    mem.cqes = m + kWqes * 64;
                    mem.sq_dbrec = reinterpret_cast<uint32_t*>(m + kWqes * 128);
                    mem.cq_dbrec = reinterpret_cast<uint32_t*>(m + kWqes * 128 + 64);
                    mem.doorbell = reinterpret_cast<uint64_t*>(m + kWqes * 128 + 128);
                    const int qp = hca.createQueuePair(kWqes, kWqes, mem);
                    IbgdaChannel& ch = channels[p * kQpsPerRank + q];
                    ch.sq = hca.sendQueue(qp);
                    ch.cq = hca.completionQueue(qp);
                    qps_of_rank0 += r == 0;
                }
            }
            tables.push_back(
                std::make_unique<DeviceMemory>(channels.size() * sizeof(IbgdaChannel)));
            tables.push_back(std::make_unique<DeviceMemory>(8 * bases.size()));
            tables.push_back(std::make_unique<DeviceMemory>(4 * keys.size()));
            DeviceMemory& ch = *tables[tables.size() - 3];
            ASSERT_EQ(cudaSuccess,
                      cudaMemcpy(ch.as<void>(), channels.data(),
                                 channels.size() * sizeof(IbgdaChannel), cudaMemcpyHostToDevice));
            ASSERT_TRUE(upload(*tables[tables.size() - 2], bases));
            ASSERT_TRUE(upload(*tables.back(), keys));
            devices[r].channels = ch.as<IbgdaChannel>();
            devices[r].remote_bases = tables[tables.size() - 2]->as<const uint64_t>();
            devices[r].rkeys = tables.back()->as<const uint32_t>();
        }
    }

    void TearDown() override { hca.stop(); }

    std::vector<IbgdaTestRank*> rankPointers() const {
        std::vector<IbgdaTestRank*> out;
        for (auto& r : ranks)
            out.push_back(r.get());
        return out;
    }

    const Shape s{2, 8, 16, 256, 3};
    SoftHca hca;
    std::vector<std::unique_ptr<IbgdaTestRank>> ranks;
    std::vector<std::unique_ptr<Pinned>> staging, queue_memory;
    std::vector<std::unique_ptr<DeviceMemory>> tables;
    std::vector<uint32_t> buffer_keys;
    std::vector<IbgdaEpDevice> devices;
    int qps_of_rank0 = 0;
};

TEST_F(IbgdaKernels, TwoRanksExchangeOnlyThroughTheSoftwareHca) {
    hca.start();
    runIbgdaRounds(s, rankPointers(), devices, 3);
    EXPECT_EQ("", hca.violation());
    // Rank 0's QPs were created first: each carried traffic.
    for (int qp = 0; qp < qps_of_rank0; ++qp)
        EXPECT_GT(hca.doorbellsRung(qp), 0u) << "QP " << qp;
}

// Rank 1's NIC never executes anything (the HCA is not started) and rank 1
// never runs: rank 0's send blocks give up on their QPs at the deadline and
// mark rank 1 inactive; the receive side stops waiting for it too.
TEST_F(IbgdaKernels, QueuesThatNeverExecuteMarkThePeerInactive) {
    const RankInputs in = makeInputs(s, 0, 0, s.max_tokens);
    IbgdaTestRank& k = *ranks[0];
    ASSERT_TRUE(upload(k.x, in.x));
    ASSERT_TRUE(upload(k.topk, in.topk_idx));
    EpGroupArgs g = k.group;
    g.timeout_ns = 200'000'000;
    const Status st = launchIbgdaDispatch(devices[0], g, k.dispatchArgs(s, in), k.stream);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(waitStream(k.stream, 30'000, "IBGDA dispatch to a dead peer", 0));
    EXPECT_EQ((std::vector<int32_t>{1, 0}), download<int32_t>(k.active, s.num_ranks));
    const auto counts = download<int32_t>(k.recv_count, s.nle());
    const auto want_rows = expectedRows(s, {in, in}, {1, 0}, 0, 0);
    EXPECT_EQ(static_cast<int>(want_rows.size()), counts[0]) << "rank 0's own tokens only";
}

}  // namespace
}  // namespace mooncake::ep
