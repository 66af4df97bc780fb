// The step of the EP kernel tests (ep_kernels_test.cc): a rank's buffers
// and context, one dispatch + combine with every output checked against the
// CPU reference (ep_reference.h), and the checks it makes. Test-only: the
// checks report through EXPECT_CHILD (a message, then `return 1` from the
// calling function, whose RankContext is `c`).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mooncake-ep/kernels/ep_kernels.h"
#include "tests/cpp/ep/ep_reference.h"
#include "tests/cpp/ep/ep_test_util.h"

namespace mooncake::ep::test {

inline constexpr int64_t kGenerousTimeoutNs =
    20'000'000'000;  // only a broken kernel waits this long
inline constexpr int64_t kFailureTimeoutNs = 2'000'000'000;
inline constexpr int64_t kStreamWaitMs = 60'000;

#define EXPECT_CHILD(cond, ...)                                                      \
    do {                                                                             \
        if (!(cond)) {                                                               \
            std::fprintf(stderr, "rank %d, %s: check failed at %s:%d: %s: ", c.rank, \
                         c.scenario.c_str(), __FILE__, __LINE__, #cond);             \
            std::fprintf(stderr, __VA_ARGS__);                                       \
            std::fprintf(stderr, "\n");                                              \
            return 1;                                                                \
        }                                                                            \
    } while (0)

// Inputs and outputs at their largest sizes, allocated once: a captured
// graph keeps the pointers it was captured with.
struct StepBuffers {
    explicit StepBuffers(const Shape& s)
        : x(static_cast<size_t>(s.max_tokens) * s.hidden * 2),
          topk(static_cast<size_t>(s.max_tokens) * s.top_k * 8),
          weights(static_cast<size_t>(s.max_tokens) * s.top_k * 4),
          recv_x(static_cast<size_t>(s.nle() * s.capacity() * s.hidden * 2)),
          recv_scales(static_cast<size_t>(s.nle() * s.capacity() * (s.hidden / 128) * 4)),
          recv_count(static_cast<size_t>(s.nle()) * 4),
          src_info(static_cast<size_t>(s.nle() * s.capacity() * 4)),
          layout(static_cast<size_t>(s.nle()) * s.num_ranks * 8),
          expert_out(static_cast<size_t>(s.nle() * s.capacity() * s.hidden * 2)),
          out(static_cast<size_t>(s.max_tokens) * s.hidden * 2) {}
    bool ok() const {
        return x.ok() && topk.ok() && weights.ok() && recv_x.ok() && recv_scales.ok() &&
               recv_count.ok() && src_info.ok() && layout.ok() && expert_out.ok() && out.ok();
    }
    DeviceMemory x, topk, weights, recv_x, recv_scales, recv_count, src_info, layout, expert_out,
        out;
};

struct RankContext {
    Shape s;
    int rank;
    std::string scenario;
    void* buffer;
    uint64_t buffer_bytes;
    void** peers;     // device [num_ranks]
    int32_t* active;  // device [num_ranks]
    cudaStream_t stream;
    Barrier* barrier;
    StepBuffers* buffers;
    // Graph mode: the first step captures dispatch and combine, every step
    // (the first included) replays them.
    bool use_graphs = false;
    cudaGraphExec_t dispatch_graph = nullptr;
    cudaGraphExec_t combine_graph = nullptr;
    uint64_t* phase_trace = nullptr;  // device [kEpTraceSlots] while a scenario traces
    // Pinned, mapped [2] or null: the error words each op's last receive
    // block copies out (error_mirror_view is how the kernels address it).
    volatile int32_t* error_mirror = nullptr;
    int32_t* error_mirror_view = nullptr;

    EpGroupArgs group(int64_t timeout_ns) const {
        EpGroupArgs g;
        g.rank = rank;
        g.num_ranks = s.num_ranks;
        g.num_experts = s.num_experts;
        g.max_tokens = s.max_tokens;
        g.hidden = s.hidden;
        g.local_buffer = buffer;
        g.local_buffer_bytes = buffer_bytes;
        g.peer_buffers = peers;
        g.active_ranks = active;
        g.timeout_ns = timeout_ns;
        g.ranks_per_device = s.num_ranks;  // every rank's process runs on GPU 0
        g.phase_trace = phase_trace;
        g.error_mirror = error_mirror_view;
        return g;
    }
};

inline int tokensFor(const Shape& s, int rank, int iteration) {
    if (iteration % 3 == 2 && rank == s.num_ranks - 1)
        return 0;  // a rank with nothing to send still signals
    return s.max_tokens - (rank * 5 + iteration * 3) % (s.max_tokens / 2);
}

inline std::vector<RankInputs> inputsFor(const Shape& s, int iteration) {
    std::vector<RankInputs> all;
    for (int r = 0; r < s.num_ranks; ++r)
        all.push_back(makeInputs(s, r, iteration, tokensFor(s, r, iteration)));
    return all;
}

// Zeroed buffers on every rank before anyone writes to a peer.
inline int resetBuffers(RankContext& c, const std::string& scenario) {
    c.scenario = scenario;
    EXPECT_CHILD(c.barrier->arrive(), "barrier before reset");
    CUDA_OK(cudaMemset(c.buffer, 0, c.buffer_bytes));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_CHILD(c.barrier->arrive(), "barrier after reset");
    return 0;
}

struct StepPlan {
    bool use_fp8 = false;
    std::vector<int> active_before;  // uploaded before the dispatch
    std::vector<int> active_after;   // expected after it (a timed-out rank at 0)
    // Expected after the combine; empty: active_after.
    std::vector<int> active_after_combine;
    bool skip_combine = false;  // this rank leaves after its dispatch
    int64_t timeout_ns = kGenerousTimeoutNs;
    int expected_error = kEpErrorNone;
    std::vector<int> expected_error_infos;
};

inline int checkActive(const RankContext& c, const std::vector<int>& expected, const char* when) {
    std::vector<int32_t> got(c.s.num_ranks);
    CUDA_OK(cudaMemcpy(got.data(), c.active, got.size() * 4, cudaMemcpyDeviceToHost));
    for (int r = 0; r < c.s.num_ranks; ++r)
        EXPECT_CHILD(got[r] == expected[r], "%s: active_ranks[%d] is %d, expected %d", when, r,
                     got[r], expected[r]);
    return 0;
}

// Dispatch outputs against the reference, row by row.
inline int checkDispatch(const RankContext& c, const StepPlan& plan,
                         const std::vector<RankInputs>& all, const std::vector<uint8_t>& data,
                         const std::vector<float>& scales, const std::vector<int32_t>& counts,
                         const std::vector<int32_t>& src_info, const std::vector<int64_t>& layout) {
    const Shape& s = c.s;
    const int64_t row_bytes = plan.use_fp8 ? s.hidden : 2 * s.hidden;
    const int groups = s.hidden / kEpFp8GroupSize;
    std::vector<uint8_t> q(s.hidden);
    std::vector<float> qs(groups);
    for (int le = 0; le < s.nle(); ++le) {
        std::vector<PackedRow> rows = expectedRows(s, all, plan.active_after, c.rank, le);
        EXPECT_CHILD(counts[le] == static_cast<int>(rows.size()),
                     "recv_count[%d] is %d, expected %zu", le, counts[le], rows.size());
        int begin = 0;
        for (int src = 0; src < s.num_ranks; ++src) {
            int count = 0;
            for (const PackedRow& r : rows)
                count += r.src == src;
            const int64_t range = layout[static_cast<size_t>(le) * s.num_ranks + src];
            EXPECT_CHILD(range == epEncodeRange(begin, count),
                         "layout_range[%d][%d] is (%lld, %lld), expected (%d, %d)", le, src,
                         static_cast<long long>(epRangeBegin(range)),
                         static_cast<long long>(epRangeCount(range)), begin, count);
            begin += count;
        }
        for (size_t i = 0; i < rows.size(); ++i) {
            const int64_t row = le * s.capacity() + static_cast<int64_t>(i);
            const RankInputs& in = all[rows[i].src];
            EXPECT_CHILD(src_info[row] == rows[i].token, "src_info[%d][%zu] is %d, expected %d", le,
                         i, src_info[row], rows[i].token);
            const uint16_t* x = &in.x[static_cast<size_t>(rows[i].token) * s.hidden];
            const uint8_t* got = &data[row * row_bytes];
            if (!plan.use_fp8) {
                EXPECT_CHILD(std::memcmp(got, x, row_bytes) == 0,
                             "BF16 row %zu of expert %d (rank %d token %d) differs", i, le,
                             rows[i].src, rows[i].token);
                continue;
            }
            quantizeRow(x, s.hidden, q.data(), qs.data());
            for (int h = 0; h < s.hidden; ++h)
                EXPECT_CHILD(got[h] == q[h],
                             "FP8 row %zu of expert %d (rank %d token %d) channel %d is 0x%02x, "
                             "expected 0x%02x",
                             i, le, rows[i].src, rows[i].token, h, got[h], q[h]);
            for (int g = 0; g < groups; ++g)
                EXPECT_CHILD(scales[row * groups + g] == qs[g],
                             "scale %d of row %zu of expert %d is %g, expected %g", g, i, le,
                             scales[row * groups + g], qs[g]);
        }
    }
    return 0;
}

// Host-to-device copies go on the test's stream. A plain cudaMemcpy from
// pageable memory may return before its DMA lands, and it runs on the legacy
// stream, which a non-blocking stream does not wait for: the kernels could
// read half-copied inputs.
inline cudaError_t upload(const RankContext& c, void* dst, const void* src, size_t bytes) {
    if (bytes == 0)  // a rank without tokens has empty (null) inputs
        return cudaSuccess;
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c.stream);
}

inline double msSince(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Launches directly, or (graph mode) captures the launch once and replays it.
inline int launchOrReplay(RankContext& c, cudaGraphExec_t* exec,
                          const std::function<Status()>& launch) {
    if (!c.use_graphs) {
        Status st = launch();
        EXPECT_CHILD(st.ok(), "launch: %s", st.toString().c_str());
        return 0;
    }
    if (*exec == nullptr) {
        CUDA_OK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
        Status st = launch();
        cudaGraph_t graph = nullptr;
        CUDA_OK(cudaStreamEndCapture(c.stream, &graph));
        EXPECT_CHILD(st.ok(), "launch under capture: %s", st.toString().c_str());
        CUDA_OK(cudaGraphInstantiate(exec, graph, 0));
        CUDA_OK(cudaGraphDestroy(graph));
    }
    CUDA_OK(cudaGraphLaunch(*exec, c.stream));
    return 0;
}

// A dispatch / combine of `num_tokens` tokens over the step buffers.
inline DispatchArgs dispatchArgsOf(const RankContext& c, int num_tokens, bool use_fp8) {
    const StepBuffers& b = *c.buffers;
    DispatchArgs d;
    d.x = b.x.as<void>();
    d.topk_idx = b.topk.as<int64_t>();
    d.num_tokens = num_tokens;
    d.top_k = c.s.top_k;
    d.use_fp8 = use_fp8;
    d.packed_recv_x = b.recv_x.as<void>();
    d.packed_recv_scales = b.recv_scales.as<float>();
    d.packed_recv_count = b.recv_count.as<int32_t>();
    d.src_info = b.src_info.as<int32_t>();
    d.layout_range = b.layout.as<int64_t>();
    return d;
}

inline CombineArgs combineArgsOf(const RankContext& c, int num_tokens) {
    const StepBuffers& b = *c.buffers;
    CombineArgs cb;
    cb.x = b.expert_out.as<void>();
    cb.src_info = b.src_info.as<int32_t>();
    cb.layout_range = b.layout.as<int64_t>();
    cb.topk_idx = b.topk.as<int64_t>();
    cb.topk_weights = b.weights.as<float>();
    cb.num_tokens = num_tokens;
    cb.top_k = c.s.top_k;
    cb.out = b.out.as<void>();
    return cb;
}

// One dispatch + combine on a participating rank, every output checked.
inline int step(RankContext& c, const std::vector<RankInputs>& all, const StepPlan& plan) {
    const Shape& s = c.s;
    const RankInputs& mine = all[c.rank];
    const int64_t cap = s.capacity();
    const int groups = s.hidden / kEpFp8GroupSize;
    const StepBuffers& b = *c.buffers;
    const DeviceMemory &x = b.x, &topk = b.topk, &weights = b.weights, &recv_x = b.recv_x,
                       &recv_scales = b.recv_scales, &recv_count = b.recv_count,
                       &src_info = b.src_info, &layout = b.layout, &expert_out = b.expert_out,
                       &out = b.out;
    CUDA_OK(upload(c, x.as<void>(), mine.x.data(), mine.x.size() * 2));
    CUDA_OK(upload(c, topk.as<void>(), mine.topk_idx.data(), mine.topk_idx.size() * 8));
    CUDA_OK(upload(c, weights.as<void>(), mine.topk_weights.data(), mine.topk_weights.size() * 4));
    std::vector<int32_t> active(plan.active_before.begin(), plan.active_before.end());
    CUDA_OK(upload(c, c.active, active.data(), active.size() * 4));

    const EpGroupArgs g = c.group(plan.timeout_ns);
    const DispatchArgs d = dispatchArgsOf(c, mine.num_tokens, plan.use_fp8);
    const auto t0 = std::chrono::steady_clock::now();
    if (launchOrReplay(c, &c.dispatch_graph, [&] { return launchDispatch(g, d, c.stream); }))
        return 1;
    EXPECT_CHILD(waitStream(c.stream, kStreamWaitMs, "dispatch", c.rank), "dispatch");
    const double dispatch_ms = msSince(t0);
    if (checkActive(c, plan.active_after, "after dispatch"))
        return 1;

    const int64_t row_bytes = plan.use_fp8 ? s.hidden : 2 * s.hidden;
    std::vector<uint8_t> h_data(static_cast<size_t>(s.nle() * cap * row_bytes));
    std::vector<float> h_scales(plan.use_fp8 ? static_cast<size_t>(s.nle() * cap * groups) : 0);
    std::vector<int32_t> h_counts(s.nle()), h_src(static_cast<size_t>(s.nle() * cap));
    std::vector<int64_t> h_layout(static_cast<size_t>(s.nle() * s.num_ranks));
    CUDA_OK(cudaMemcpy(h_data.data(), recv_x.as<void>(), h_data.size(), cudaMemcpyDeviceToHost));
    if (plan.use_fp8)
        CUDA_OK(cudaMemcpy(h_scales.data(), recv_scales.as<void>(), h_scales.size() * 4,
                           cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_counts.data(), recv_count.as<void>(), h_counts.size() * 4,
                       cudaMemcpyDeviceToHost));
    CUDA_OK(
        cudaMemcpy(h_src.data(), src_info.as<void>(), h_src.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_layout.data(), layout.as<void>(), h_layout.size() * 8,
                       cudaMemcpyDeviceToHost));
    if (checkDispatch(c, plan, all, h_data, h_scales, h_counts, h_src, h_layout))
        return 1;
    if (plan.skip_combine) {
        std::printf("rank %d %s: dispatch ok (%.1f ms), combine skipped on purpose\n", c.rank,
                    c.scenario.c_str(), dispatch_ms);
        std::fflush(stdout);
        return 0;
    }

    // The test's experts, from the reference rows (packed layout, unused rows zero).
    std::vector<uint16_t> y(static_cast<size_t>(s.nle() * cap * s.hidden), 0);
    for (int le = 0; le < s.nle(); ++le) {
        const int64_t expert = static_cast<int64_t>(c.rank) * s.nle() + le;
        std::vector<PackedRow> rows = expectedRows(s, all, plan.active_after, c.rank, le);
        for (size_t i = 0; i < rows.size(); ++i) {
            const uint16_t* xr = &all[rows[i].src].x[static_cast<size_t>(rows[i].token) * s.hidden];
            uint16_t* yr = &y[(le * cap + static_cast<int64_t>(i)) * s.hidden];
            for (int h = 0; h < s.hidden; ++h)
                yr[h] = expertOutput(xr[h], expert);
        }
    }
    CUDA_OK(upload(c, expert_out.as<void>(), y.data(), y.size() * 2));
    const CombineArgs cb = combineArgsOf(c, mine.num_tokens);
    const auto t1 = std::chrono::steady_clock::now();
    if (launchOrReplay(c, &c.combine_graph, [&] { return launchCombine(g, cb, c.stream); }))
        return 1;
    EXPECT_CHILD(waitStream(c.stream, kStreamWaitMs, "combine", c.rank), "combine");
    const double combine_ms = msSince(t1);
    const std::vector<int>& combined =
        plan.active_after_combine.empty() ? plan.active_after : plan.active_after_combine;
    if (checkActive(c, combined, "after combine"))
        return 1;

    std::vector<uint16_t> h_out(static_cast<size_t>(mine.num_tokens) * s.hidden);
    CUDA_OK(cudaMemcpy(h_out.data(), out.as<void>(), h_out.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> got(h_out.size());
    size_t inexact = 0;
    std::vector<float> want = expectedCombine(s, mine, combined);
    for (size_t i = 0; i < h_out.size(); ++i) {
        got[i] = bf16Value(h_out[i]);
        inexact += h_out[i] != bf16Bits(want[i]);
    }
    const double diff = calcDiff(got, want);
    EXPECT_CHILD(diff < 1e-5, "combine calc_diff %g (%zu of %zu values not bit-exact)", diff,
                 inexact, h_out.size());

    EpState state;
    CUDA_OK(cudaMemcpy(&state, c.buffer, sizeof(state), cudaMemcpyDeviceToHost));
    EXPECT_CHILD(state.error_code == plan.expected_error, "error word %d (info %d), expected %d",
                 state.error_code, state.error_info, plan.expected_error);
    if (c.error_mirror) {
        // The combine's last receive block copied the words out; the stream
        // is idle, so nothing has changed them since.
        EXPECT_CHILD(c.error_mirror[0] == state.error_code && c.error_mirror[1] == state.error_info,
                     "mirrored error words (%d, %d), the device's (%d, %d)", c.error_mirror[0],
                     c.error_mirror[1], state.error_code, state.error_info);
    }
    if (plan.expected_error != kEpErrorNone) {
        bool known = false;
        for (int v : plan.expected_error_infos)
            known |= v == state.error_info;
        EXPECT_CHILD(known, "error info %d is none of the injected ids", state.error_info);
        CUDA_OK(cudaMemsetAsync(&epState(c.buffer)->error_code, 0, 8, c.stream));
        CUDA_OK(cudaStreamSynchronize(c.stream));
    }
    // Times include the host wait and are printed for the record only.
    std::printf(
        "rank %d %s: %s step ok, %d tokens, dispatch %.1f ms, combine %.1f ms, combine calc_diff "
        "%.3g, %zu/%zu not bit-exact\n",
        c.rank, c.scenario.c_str(), plan.use_fp8 ? "fp8" : "bf16", mine.num_tokens, dispatch_ms,
        combine_ms, diff, inexact, h_out.size());
    std::fflush(stdout);  // children leave through _exit
    return 0;
}

}  // namespace mooncake::ep::test
