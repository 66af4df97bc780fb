// The IBGDA send kernels end to end without a NIC: two ranks in one process,
// each with its EP buffer and staging in pinned host memory (the GPU and the
// software HCA address the same bytes), neither in the other's peer table,
// so every byte between them goes as RDMA WRITEs and fetch-adds that the
// kernels post into queues the software HCA executes from a host thread.
// Outputs are checked against the CPU reference of ep_reference.h over
// three iterations (both phases, and a phase reused: the shadows). Then a
// peer whose queues never execute: the sender marks it inactive at the
// deadline instead of hanging. Skipped, with the reason, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "mooncake-ep/ibgda/ibgda_kernels.h"
#include "tests/cpp/ep/ep_reference.h"
#include "tests/cpp/ep/ep_test_util.h"
#include "tests/cpp/rdma/soft_hca.h"

namespace mooncake::ep {
namespace {

using namespace test;  // NOLINT: the reference's vocabulary
using te::rdma::soft::QueueMemory;
using te::rdma::soft::SoftHca;

constexpr int kQpsPerRank = 2;
constexpr uint32_t kWqes = 64;
constexpr int64_t kKernelTimeoutNs = 5'000'000'000;
constexpr int64_t kStreamWaitMs = 30'000;

// Pinned, mapped host memory: with unified addressing the device uses the
// host address, so the software HCA executes on the bytes the kernels see.
class Pinned {
public:
    explicit Pinned(size_t bytes) {
        if (cudaHostAlloc(&p_, bytes, cudaHostAllocMapped) != cudaSuccess)
            p_ = nullptr;
        else
            std::memset(p_, 0, bytes);
    }
    ~Pinned() {
        if (p_)
            (void)cudaFreeHost(p_);
    }
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
    template <typename T>
    T* as() const {
        return static_cast<T*>(p_);
    }

private:
    void* p_ = nullptr;
};

template <typename T>
bool upload(const DeviceMemory& dst, const std::vector<T>& v) {
    return cudaMemcpy(dst.as<void>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) ==
           cudaSuccess;
}

template <typename T>
std::vector<T> download(const DeviceMemory& src, size_t count) {
    std::vector<T> v(count);
    EXPECT_EQ(cudaSuccess,
              cudaMemcpy(v.data(), src.as<void>(), count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

struct Rank {
    Rank(const Shape& s, int64_t buffer_bytes, int64_t staging_bytes)
        : buffer(static_cast<size_t>(buffer_bytes)),
          staging(static_cast<size_t>(staging_bytes)),
          channels(sizeof(IbgdaChannel) * s.num_ranks * kQpsPerRank),
          remote_bases(8 * s.num_ranks),
          rkeys(4 * s.num_ranks),
          peers(8 * s.num_ranks),
          active(4 * s.num_ranks),
          x(2 * s.max_tokens * s.hidden),
          topk(8 * s.max_tokens * s.top_k),
          weights(4 * s.max_tokens * s.top_k),
          recv_x(2 * s.nle() * s.capacity() * s.hidden),
          recv_count(4 * s.nle()),
          src_info(4 * s.nle() * s.capacity()),
          layout(8 * s.nle() * s.num_ranks),
          expert_out(2 * s.nle() * s.capacity() * s.hidden),
          out(2 * s.max_tokens * s.hidden) {}

    Pinned buffer, staging;
    DeviceMemory channels, remote_bases, rkeys, peers, active, x, topk, weights, recv_x, recv_count,
        src_info, layout, expert_out, out;
    std::vector<std::unique_ptr<Pinned>> queue_memory;
    uint32_t buffer_key = 0, staging_key = 0;
    int64_t buffer_bytes = 0, staging_bytes = 0;
    cudaStream_t stream = nullptr;
};

class IbgdaKernels : public ::testing::Test {
protected:
    void SetUp() override {
        SKIP_WITHOUT_GPU();
        const int64_t buffer_bytes =
            EpLayout{s.num_ranks, s.num_experts, s.max_tokens, s.hidden}.totalBytes();
        const int64_t staging_bytes = ibgdaStagingBytesFor(buffer_bytes);
        for (int r = 0; r < s.num_ranks; ++r) {
            ranks.push_back(std::make_unique<Rank>(s, buffer_bytes, staging_bytes));
            Rank& k = *ranks.back();
            ASSERT_NE(nullptr, k.buffer.as<void>());
            ASSERT_NE(nullptr, k.staging.as<void>());
            k.buffer_bytes = buffer_bytes;
            k.staging_bytes = staging_bytes;
            k.buffer_key = hca.registerMemory(k.buffer.as<void>(), buffer_bytes);
            k.staging_key = hca.registerMemory(k.staging.as<void>(), staging_bytes);
            ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
        }
        for (int r = 0; r < s.num_ranks; ++r) {
            Rank& k = *ranks[r];
            std::vector<IbgdaChannel> channels(s.num_ranks * kQpsPerRank);
            std::vector<uint64_t> bases;
            std::vector<uint32_t> keys;
            std::vector<void*> peers;
            for (int p = 0; p < s.num_ranks; ++p) {
                bases.push_back(reinterpret_cast<uint64_t>(ranks[p]->buffer.as<void>()));
                keys.push_back(ranks[p]->buffer_key);
                // Only the rank itself is in its peer table: the other is IBGDA's.
                peers.push_back(p == r ? k.buffer.as<void>() : nullptr);
                if (p == r)
                    continue;
                for (int q = 0; q < kQpsPerRank; ++q) {
                    k.queue_memory.push_back(std::make_unique<Pinned>(
                        kWqes * 64 * 2 + 64 * 3));  // WQEs, CQEs, records, doorbell
                    unsigned char* m = k.queue_memory.back()->as<unsigned char>();
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
                    qps_of[r].push_back(qp);
                }
            }
            ASSERT_EQ(cudaSuccess,
                      cudaMemcpy(k.channels.as<void>(), channels.data(),
                                 channels.size() * sizeof(IbgdaChannel), cudaMemcpyHostToDevice));
            ASSERT_TRUE(upload(k.remote_bases, bases));
            ASSERT_TRUE(upload(k.rkeys, keys));
            ASSERT_TRUE(upload(k.peers, peers));
            ASSERT_TRUE(upload(k.active, std::vector<int32_t>(s.num_ranks, 1)));
        }
    }

    void TearDown() override {
        hca.stop();
        for (auto& k : ranks) {
            if (k->stream)
                (void)cudaStreamDestroy(k->stream);
        }
    }

    EpGroupArgs group(int r) const {
        const Rank& k = *ranks[r];
        EpGroupArgs g;
        g.rank = r;
        g.num_ranks = s.num_ranks;
        g.num_experts = s.num_experts;
        g.max_tokens = s.max_tokens;
        g.hidden = s.hidden;
        g.local_buffer = k.buffer.as<void>();
        g.local_buffer_bytes = static_cast<uint64_t>(k.buffer_bytes);
        g.peer_buffers = k.peers.as<void* const>();
        g.active_ranks = k.active.as<int32_t>();
        g.timeout_ns = kKernelTimeoutNs;
        return g;
    }

    IbgdaEpDevice device(int r) const {
        const Rank& k = *ranks[r];
        IbgdaEpDevice d;
        d.channels = k.channels.as<IbgdaChannel>();
        d.qps_per_rank = kQpsPerRank;
        d.remote_bases = k.remote_bases.as<const uint64_t>();
        d.rkeys = k.rkeys.as<const uint32_t>();
        d.staging = k.staging.as<char>();
        d.staging_bytes = static_cast<uint64_t>(k.staging_bytes);
        d.staging_lkey = k.staging_key;
        return d;
    }

    DispatchArgs dispatchArgs(int r, const RankInputs& in) const {
        const Rank& k = *ranks[r];
        DispatchArgs a;
        a.x = k.x.as<void>();
        a.topk_idx = k.topk.as<int64_t>();
        a.num_tokens = in.num_tokens;
        a.top_k = s.top_k;
        a.packed_recv_x = k.recv_x.as<void>();
        a.packed_recv_count = k.recv_count.as<int32_t>();
        a.src_info = k.src_info.as<int32_t>();
        a.layout_range = k.layout.as<int64_t>();
        return a;
    }

    const Shape s{2, 8, 16, 256, 3};
    SoftHca hca;
    std::vector<std::unique_ptr<Rank>> ranks;
    std::vector<int> qps_of[2];
};

TEST_F(IbgdaKernels, TwoRanksExchangeOnlyThroughTheSoftwareHca) {
    hca.start();
    const std::vector<int> all_active(s.num_ranks, 1);
    for (int it = 0; it < 3; ++it) {
        std::vector<RankInputs> inputs;
        for (int r = 0; r < s.num_ranks; ++r)
            inputs.push_back(makeInputs(s, r, it, s.max_tokens - r));
        for (int r = 0; r < s.num_ranks; ++r) {
            Rank& k = *ranks[r];
            ASSERT_TRUE(upload(k.x, inputs[r].x));
            ASSERT_TRUE(upload(k.topk, inputs[r].topk_idx));
            ASSERT_TRUE(upload(k.weights, inputs[r].topk_weights));
            const Status st =
                launchIbgdaDispatch(device(r), group(r), dispatchArgs(r, inputs[r]), k.stream);
            ASSERT_TRUE(st.ok()) << st.message();
        }
        for (int r = 0; r < s.num_ranks; ++r)
            ASSERT_TRUE(waitStream(ranks[r]->stream, kStreamWaitMs, "IBGDA dispatch", r));
        ASSERT_EQ("", hca.violation());
        for (int r = 0; r < s.num_ranks; ++r) {
            Rank& k = *ranks[r];
            ASSERT_EQ(std::vector<int32_t>(s.num_ranks, 1),
                      download<int32_t>(k.active, s.num_ranks))
                << "rank " << r << " iteration " << it;
            const auto counts = download<int32_t>(k.recv_count, s.nle());
            const auto src = download<int32_t>(k.src_info, s.nle() * s.capacity());
            const auto data = download<uint16_t>(k.recv_x, s.nle() * s.capacity() * s.hidden);
            std::vector<uint16_t> y(data.size(), 0);
            for (int le = 0; le < s.nle(); ++le) {
                const auto rows = expectedRows(s, inputs, all_active, r, le);
                ASSERT_EQ(static_cast<int>(rows.size()), counts[le])
                    << "rank " << r << " le " << le;
                for (size_t i = 0; i < rows.size(); ++i) {
                    const int64_t row = le * s.capacity() + static_cast<int64_t>(i);
                    ASSERT_EQ(rows[i].token, src[row]) << "rank " << r << " le " << le << " " << i;
                    const uint16_t* want =
                        &inputs[rows[i].src].x[static_cast<size_t>(rows[i].token) * s.hidden];
                    ASSERT_EQ(0, std::memcmp(want, &data[row * s.hidden], 2 * s.hidden))
                        << "rank " << r << " le " << le << " row " << i;
                    for (int h = 0; h < s.hidden; ++h)
                        y[row * s.hidden + h] = expertOutput(want[h], r * s.nle() + le);
                }
            }
            ASSERT_TRUE(upload(k.expert_out, y));
        }
        for (int r = 0; r < s.num_ranks; ++r) {
            Rank& k = *ranks[r];
            CombineArgs c;
            c.x = k.expert_out.as<void>();
            c.src_info = k.src_info.as<int32_t>();
            c.layout_range = k.layout.as<int64_t>();
            c.topk_idx = k.topk.as<int64_t>();
            c.topk_weights = k.weights.as<float>();
            c.num_tokens = inputs[r].num_tokens;
            c.top_k = s.top_k;
            c.out = k.out.as<void>();
            const Status st = launchIbgdaCombine(device(r), group(r), c, k.stream);
            ASSERT_TRUE(st.ok()) << st.message();
        }
        for (int r = 0; r < s.num_ranks; ++r)
            ASSERT_TRUE(waitStream(ranks[r]->stream, kStreamWaitMs, "IBGDA combine", r));
        for (int r = 0; r < s.num_ranks; ++r) {
            const auto out = download<uint16_t>(ranks[r]->out, inputs[r].num_tokens * s.hidden);
            const std::vector<float> want = expectedCombine(s, inputs[r], all_active);
            std::vector<float> got(out.size());
            for (size_t i = 0; i < out.size(); ++i)
                got[i] = bf16Value(out[i]);
            EXPECT_LT(calcDiff(got, want), 1e-5) << "rank " << r << " iteration " << it;
        }
    }
    EXPECT_EQ("", hca.violation());
    for (int qp : qps_of[0])
        EXPECT_GT(hca.doorbellsRung(qp), 0u) << "every QP carried traffic";
}

// Rank 1's NIC never executes anything (the HCA is not started) and rank 1
// never runs: rank 0's send blocks give up on their QPs at the deadline and
// mark rank 1 inactive; the receive side stops waiting for it too.
TEST_F(IbgdaKernels, QueuesThatNeverExecuteMarkThePeerInactive) {
    const RankInputs in = makeInputs(s, 0, 0, s.max_tokens);
    Rank& k = *ranks[0];
    ASSERT_TRUE(upload(k.x, in.x));
    ASSERT_TRUE(upload(k.topk, in.topk_idx));
    EpGroupArgs g = group(0);
    g.timeout_ns = 200'000'000;
    const Status st = launchIbgdaDispatch(device(0), g, dispatchArgs(0, in), k.stream);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(waitStream(k.stream, kStreamWaitMs, "IBGDA dispatch to a dead peer", 0));
    const auto active = download<int32_t>(k.active, s.num_ranks);
    EXPECT_EQ(1, active[0]);
    EXPECT_EQ(0, active[1]);
    const auto counts = download<int32_t>(k.recv_count, s.nle());
    const auto want_rows = expectedRows(s, {in, in}, {1, 0}, 0, 0);
    EXPECT_EQ(static_cast<int>(want_rows.size()), counts[0]) << "rank 0's own tokens only";
}

}  // namespace
}  // namespace mooncake::ep
