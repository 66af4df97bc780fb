// Two EP ranks in one process whose bytes move only over IBGDA: the I/O
// each rank needs (inputs, outputs, active_ranks, a peer table holding only
// itself) and the rounds of dispatch + combine checked against the CPU
// reference of ep_reference.h. The ranks' EP buffers are in pinned host
// memory, so a software HCA (directly, or behind the fake verbs provider)
// executes on the bytes the kernels see. Used by ibgda_kernels_test.cc and
// tests/cpp/rdma/rdma_fake_verbs_test.cc.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "mooncake-ep/ibgda/ibgda_kernels.h"
#include "tests/cpp/ep/ep_reference.h"
#include "tests/cpp/ep/ep_test_util.h"

namespace mooncake::ep::test {

// Pinned, mapped host memory: with unified addressing the device uses the
// host address, so a software HCA executes on the bytes the kernels see.
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

inline int64_t ibgdaTestBufferBytes(const Shape& s) {
    return EpLayout{s.num_ranks, s.num_experts, s.max_tokens, s.hidden}.totalBytes();
}

// One rank's buffer (pinned host memory for a software HCA, device memory
// for a NIC), inputs, outputs and stream. Its peer table has only itself:
// every other rank is IBGDA's.
struct IbgdaTestRank {
    IbgdaTestRank(const Shape& s, int rank, bool buffer_on_device = false)
        : peers(8 * s.num_ranks),
          active(4 * s.num_ranks),
          x(2 * s.max_tokens * s.hidden),
          topk(8 * s.max_tokens * s.top_k),
          weights(4 * s.max_tokens * s.top_k),
          recv_x(2 * s.nle() * s.capacity() * s.hidden),
          recv_count(4 * s.nle()),
          src_info(4 * s.nle() * s.capacity()),
          layout(8 * s.nle() * s.num_ranks),
          expert_out(2 * s.nle() * s.capacity() * s.hidden),
          out(2 * s.max_tokens * s.hidden) {
        const auto bytes = static_cast<size_t>(ibgdaTestBufferBytes(s));
        if (buffer_on_device) {
            device_buffer = std::make_unique<DeviceMemory>(bytes);
            if (device_buffer->ok() &&
                cudaMemset(device_buffer->as<void>(), 0, bytes) == cudaSuccess)
                buffer = device_buffer->as<void>();
        } else {
            pinned_buffer = std::make_unique<Pinned>(bytes);
            buffer = pinned_buffer->as<void>();
        }
        std::vector<void*> table(s.num_ranks, nullptr);
        table[rank] = buffer;
        ok = buffer && upload(peers, table) &&
             upload(active, std::vector<int32_t>(s.num_ranks, 1)) &&
             cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess;
        group.rank = rank;
        group.num_ranks = s.num_ranks;
        group.num_experts = s.num_experts;
        group.max_tokens = s.max_tokens;
        group.hidden = s.hidden;
        group.local_buffer = buffer;
        group.local_buffer_bytes = static_cast<uint64_t>(ibgdaTestBufferBytes(s));
        group.peer_buffers = peers.as<void* const>();
        group.active_ranks = active.as<int32_t>();
        group.timeout_ns = 5'000'000'000;
    }
    ~IbgdaTestRank() {
        if (stream)
            (void)cudaStreamDestroy(stream);
    }

    DispatchArgs dispatchArgs(const Shape& s, const RankInputs& in) const {
        DispatchArgs a;
        a.x = x.as<void>();
        a.topk_idx = topk.as<int64_t>();
        a.num_tokens = in.num_tokens;
        a.top_k = s.top_k;
        a.packed_recv_x = recv_x.as<void>();
        a.packed_recv_count = recv_count.as<int32_t>();
        a.src_info = src_info.as<int32_t>();
        a.layout_range = layout.as<int64_t>();
        return a;
    }

    std::unique_ptr<Pinned> pinned_buffer;
    std::unique_ptr<DeviceMemory> device_buffer;
    void* buffer = nullptr;  // the EP buffer, zeroed
    DeviceMemory peers, active, x, topk, weights, recv_x, recv_count, src_info, layout, expert_out,
        out;
    EpGroupArgs group;
    cudaStream_t stream = nullptr;
    bool ok = false;
};

// `iterations` rounds of BF16 dispatch + combine on every rank, launched
// with devices[r] (each rank's IBGDA view), every output checked.
inline void runIbgdaRounds(const Shape& s, const std::vector<IbgdaTestRank*>& ranks,
                           const std::vector<IbgdaEpDevice>& devices, int iterations) {
    constexpr int64_t kStreamWaitMs = 30'000;
    const std::vector<int> all_active(s.num_ranks, 1);
    for (int it = 0; it < iterations; ++it) {
        std::vector<RankInputs> inputs;
        for (int r = 0; r < s.num_ranks; ++r)
            inputs.push_back(makeInputs(s, r, it, s.max_tokens - r));
        for (int r = 0; r < s.num_ranks; ++r) {
            IbgdaTestRank& k = *ranks[r];
            ASSERT_TRUE(upload(k.x, inputs[r].x));
            ASSERT_TRUE(upload(k.topk, inputs[r].topk_idx));
            ASSERT_TRUE(upload(k.weights, inputs[r].topk_weights));
            const Status st =
                launchIbgdaDispatch(devices[r], k.group, k.dispatchArgs(s, inputs[r]), k.stream);
            ASSERT_TRUE(st.ok()) << st.message();
        }
        for (int r = 0; r < s.num_ranks; ++r)
            ASSERT_TRUE(waitStream(ranks[r]->stream, kStreamWaitMs, "IBGDA dispatch", r));
        for (int r = 0; r < s.num_ranks; ++r) {
            IbgdaTestRank& k = *ranks[r];
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
            IbgdaTestRank& k = *ranks[r];
            CombineArgs c;
            c.x = k.expert_out.as<void>();
            c.src_info = k.src_info.as<int32_t>();
            c.layout_range = k.layout.as<int64_t>();
            c.topk_idx = k.topk.as<int64_t>();
            c.topk_weights = k.weights.as<float>();
            c.num_tokens = inputs[r].num_tokens;
            c.top_k = s.top_k;
            c.out = k.out.as<void>();
            const Status st = launchIbgdaCombine(devices[r], k.group, c, k.stream);
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
}

}  // namespace mooncake::ep::test
