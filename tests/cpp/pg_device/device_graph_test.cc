// Device collectives captured into a CUDA graph (GroupWindow::nextCall with
// `captured`) between forked ranks on the one GPU. Replays take their call
// numbers from the device call counter, so a graph of a one-shot and a
// chunked two-shot all_reduce stays exact replayed again and again, with
// eager calls queued between replays; after a membership change a replay
// fails as stale, writes nothing and reports to the graph result, and the
// ranks go on in the next epoch; the first call of an epoch cannot be
// captured. Skips with the reason where no GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/group_window.h"
#include "tests/cpp/pg_device/device_group_util.h"
#include "tests/cpp/pg_device/run_ranks.h"
#include "tests/cpp/pg_device/window_rank.h"

namespace mooncake::pg::device::test {
namespace {

constexpr uint64_t kSlot = 4096;
constexpr int64_t kTimeoutNs = 20'000'000'000;
// One-shot (fits a slot), and two-shot in several chunks of 4 KiB slots.
constexpr size_t kCounts[] = {100, 3 * 1024 + 5};

float input(int rank, size_t i, int round) {
    return static_cast<float>((rank + 1) * static_cast<int>(i % 89 + 1) + round);
}

// The graph's buffers: per call an input and an output of kCounts[c] floats.
struct GraphBuffers {
    float* in[2] = {};
    float* out[2] = {};
    ~GraphBuffers() {
        for (int c = 0; c < 2; ++c) {
            cudaFree(in[c]);
            cudaFree(out[c]);
        }
    }
};

int fill(WindowRank& w, float* d, const std::vector<float>& values) {
    CUDA_CHILD_OK(cudaMemcpyAsync(d, values.data(), values.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, w.stream));
    return 0;
}

// Captures both all_reduces (in -> out) into one graph on the rank's stream.
int capture(WindowRank& w, GraphBuffers& b, cudaGraphExec_t* exec) {
    cudaGraph_t graph = nullptr;
    CUDA_CHILD_OK(cudaStreamBeginCapture(w.stream, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < 2; ++c) {
        auto call = w.window->nextCall(kTimeoutNs, w.stream, /*captured=*/true);
        CHILD_OK(call.status());
        DeviceGroupView v = call.value();
        v.max_blocks = 8;  // ctest runs GPU tests side by side
        CHILD_OK(allReduce(v, b.in[c], b.out[c], kCounts[c], DataType::kFloat32, ReduceOp::kSum,
                           /*seq=*/0, w.window->deviceResult(GroupWindow::kGraphResultSlot),
                           w.stream));
    }
    CUDA_CHILD_OK(cudaStreamEndCapture(w.stream, &graph));
    CUDA_CHILD_OK(cudaGraphInstantiate(exec, graph, 0));
    CUDA_CHILD_OK(cudaGraphDestroy(graph));
    return 0;
}

// One replay with round-specific inputs, checked exactly (2 ranks).
int replayAndCheck(WindowRank& w, int rank, GraphBuffers& b, cudaGraphExec_t exec, int round) {
    for (int c = 0; c < 2; ++c) {
        std::vector<float> in(kCounts[c]);
        for (size_t i = 0; i < in.size(); ++i)
            in[i] = input(rank, i, round);
        if (int rc = fill(w, b.in[c], in); rc != 0)
            return rc;
    }
    CUDA_CHILD_OK(cudaGraphLaunch(exec, w.stream));
    CUDA_CHILD_OK(cudaStreamSynchronize(w.stream));
    CHILD_CHECK(w.window->graphResult().status == 0);
    for (int c = 0; c < 2; ++c) {
        std::vector<float> out(kCounts[c]);
        CUDA_CHILD_OK(
            cudaMemcpy(out.data(), b.out[c], out.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < out.size(); ++i) {
            const float want = input(0, i, round) + input(1, i, round);
            if (out[i] != want) {
                std::fprintf(stderr, "rank %d replay %d call %d element %zu: %g, expected %g\n",
                             rank, round, c, i, out[i], want);
                return 1;
            }
        }
    }
    return 0;
}

TEST(DeviceGraph, ReplaysStayExactAmongEagerCallsAndFailStaleAfterAMembershipChange) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(2, [&](int rank) {
        WindowRank w;
        if (int rc = start(w, dir.path(), rank, kSlot); rc != 0)
            return rc;
        const Deadline dl = Deadline::afterMs(kWaitMs);
        CHILD_OK(w.window->applyView({segment(0), segment(1)}, 1, dl));
        // The epoch's first call restarts the numbering: not in a graph.
        auto first = w.window->nextCall(kTimeoutNs, w.stream, /*captured=*/true);
        CHILD_CHECK(first.status().code() == StatusCode::kInvalidArgument);

        GraphBuffers b;
        float* eager = nullptr;
        for (int c = 0; c < 2; ++c) {
            CUDA_CHILD_OK(cudaMalloc(&b.in[c], kCounts[c] * sizeof(float)));
            CUDA_CHILD_OK(cudaMalloc(&b.out[c], kCounts[c] * sizeof(float)));
        }
        CUDA_CHILD_OK(cudaMalloc(&eager, kCounts[1] * sizeof(float)));
        if (int rc = sumOnce(w, rank, {0, 1}, kCounts[1], eager); rc != 0)
            return rc;
        cudaGraphExec_t exec = nullptr;
        if (int rc = capture(w, b, &exec); rc != 0)
            return rc;
        for (int round = 0; round < 6; ++round) {
            if (int rc = replayAndCheck(w, rank, b, exec, round); rc != 0)
                return rc;
            // Eager calls between replays, of both kinds, take the next numbers.
            if (round % 2 == 1) {
                if (int rc = sumOnce(w, rank, {0, 1}, kCounts[round % 4 == 1 ? 0 : 1], eager);
                    rc != 0)
                    return rc;
            }
        }
        CHILD_OK(barrier(*w.store, "replayed", 2));

        // The membership changes: the next replay touches nothing.
        w.window->noteCommittedEpoch(2);
        for (int c = 0; c < 2; ++c) {
            if (int rc = fill(w, b.out[c], std::vector<float>(kCounts[c], -1.0f)); rc != 0)
                return rc;
        }
        CUDA_CHILD_OK(cudaGraphLaunch(exec, w.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(w.stream));  // no hang, no trap
        CHILD_CHECK(w.window->graphResult().status ==
                    static_cast<int32_t>(DeviceStatus::kStaleEpoch));
        for (int c = 0; c < 2; ++c) {
            std::vector<float> out(kCounts[c]);
            CUDA_CHILD_OK(cudaMemcpy(out.data(), b.out[c], out.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost));
            for (float x : out)
                CHILD_CHECK(x == -1.0f);
        }
        w.window->clearGraphResult();
        CHILD_CHECK(w.window->graphResult().status == 0);

        // The new epoch runs, and a graph captured in it replays exactly.
        CHILD_OK(w.window->applyView({segment(0), segment(1)}, 2, dl));
        if (int rc = sumOnce(w, rank, {0, 1}, kCounts[0], eager); rc != 0)
            return rc;
        CUDA_CHILD_OK(cudaGraphExecDestroy(exec));
        if (int rc = capture(w, b, &exec); rc != 0)
            return rc;
        for (int round = 10; round < 12; ++round) {
            if (int rc = replayAndCheck(w, rank, b, exec, round); rc != 0)
                return rc;
        }
        CUDA_CHILD_OK(cudaGraphExecDestroy(exec));
        cudaFree(eager);
        CHILD_OK(barrier(*w.store, "done", 2));
        return 0;
    });
}

}  // namespace
}  // namespace mooncake::pg::device::test
