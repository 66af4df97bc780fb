// Device one-shot all_reduce between processes on the one GPU: exact results
// for every dtype and op on constructed inputs, both parities back to back,
// unaligned buffers; a mismatched call failing on every rank and the group
// staying usable; a silent peer timing out with the context intact; the
// abort word; a stale epoch touching no peer. Skips with the reason where no
// GPU is usable.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>

#include "mooncake-pg/device/all_reduce.h"
#include "tests/cpp/pg_device/device_group_util.h"
#include "tests/cpp/pg_device/reduce_reference.h"
#include "tests/cpp/pg_device/run_ranks.h"

namespace mooncake::pg::device::test {
namespace {

constexpr uint64_t kSlotBytes = 1 << 20;

// One all_reduce of `count` elements of T with op, at `offset` elements into
// the device buffers; checks every element. Returns 0 or a failing code.
template <typename T>
int checkOne(Rank& r, DataType dtype, ReduceOp op, size_t count, size_t offset, uint64_t seq,
             T* d_in, T* d_out) {
    // Not std::vector: vector<bool> has no contiguous storage.
    std::unique_ptr<T[]> in(new T[count]), out(new T[count]);
    for (size_t i = 0; i < count; ++i)
        in[i] = inputElement<T>(op, r.rank, i);
    // On the call's stream: a pageable cudaMemcpy may return before its DMA
    // lands, and the non-blocking stream would not wait for it.
    CUDA_CHILD_OK(cudaMemcpyAsync(d_in + offset, in.get(), count * sizeof(T),
                                  cudaMemcpyHostToDevice, r.stream));
    r.clearResult();
    CHILD_OK(oneShotAllReduce(r.view, d_in + offset, d_out + offset, count, dtype, op, seq,
                              r.deviceResult(), r.stream));
    CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
    CHILD_CHECK(r.hostResult()->status == 0);
    CUDA_CHILD_OK(cudaMemcpy(out.get(), d_out + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    if (size_t i = firstWrongElement(out.get(), op, r.size, 0, count); i < count) {
        std::fprintf(stderr, "rank %d dtype %s op %s element %zu differs\n", r.rank,
                     dataTypeName(dtype), reduceOpName(op), i);
        return 1;
    }
    return 0;
}

template <typename T>
int checkDtype(Rank& r, DataType dtype, uint64_t* seq) {
    constexpr size_t kCount = 1003;  // an odd tail after the 16-byte vectors
    return forEachSupportedOp<T>(dtype, kCount + 1, [&](T* d_in, T* d_out, ReduceOp op) {
        // Aligned, then one element in (unaligned for every type but bytes).
        int rc = checkOne<T>(r, dtype, op, kCount, 0, (*seq)++, d_in, d_out);
        return rc != 0 ? rc : checkOne<T>(r, dtype, op, kCount, 1, (*seq)++, d_in, d_out);
    });
}

int everyDtypeAndOp(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    uint64_t seq = 0;
    const int rc = forEachDtype([&](auto type, DataType dtype) {
        return checkDtype<typename decltype(type)::type>(r, dtype, &seq);
    });
    if (rc == 0)
        CHILD_OK(barrier(*r.store, "end", size));
    return rc;
}

class DeviceAllReduce : public ::testing::TestWithParam<int> {};

TEST_P(DeviceAllReduce, EveryDtypeAndOpIsExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) { return everyDtypeAndOp(dir.path(), rank, size); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceAllReduce, ::testing::Values(2, 3, 4));

// float sum of all ranks' (rank + 1) * (i + iteration), exact in float.
int runSums(Rank& r, float* d_in, float* d_out, size_t count, uint64_t seq, int iteration,
            int size) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i)
        in[i] = static_cast<float>((r.rank + 1) * (i % 100 + iteration));
    CUDA_CHILD_OK(
        cudaMemcpyAsync(d_in, in.data(), count * sizeof(float), cudaMemcpyHostToDevice, r.stream));
    r.clearResult();
    CHILD_OK(oneShotAllReduce(r.view, d_in, d_out, count, DataType::kFloat32, ReduceOp::kSum, seq,
                              r.deviceResult(), r.stream));
    CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
    CHILD_CHECK(r.hostResult()->status == 0);
    CUDA_CHILD_OK(cudaMemcpy(out.data(), d_out, count * sizeof(float), cudaMemcpyDeviceToHost));
    const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
    for (size_t i = 0; i < count; ++i)
        CHILD_CHECK(out[i] == ranks_sum * static_cast<float>(i % 100 + iteration));
    return 0;
}

TEST(DeviceAllReduceFailures, MismatchFailsEveryRankThenTheGroupGoesOn) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(3, [&](int rank) {
        Rank r;
        if (int rc = setUp(r, dir.path(), rank, 3, kSlotBytes); rc != 0)
            return rc;
        float *d_in = nullptr, *d_out = nullptr;
        CUDA_CHILD_OK(cudaMalloc(&d_in, 4096 * sizeof(float)));
        CUDA_CHILD_OK(cudaMalloc(&d_out, 4096 * sizeof(float)));
        // Rank 1 passes one element more.
        r.clearResult();
        CHILD_OK(oneShotAllReduce(r.view, d_in, d_out, rank == 1 ? 1001 : 1000, DataType::kFloat32,
                                  ReduceOp::kSum, 0, r.deviceResult(), r.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
        CHILD_CHECK(r.hostResult()->status == static_cast<int32_t>(DeviceStatus::kMismatch));
        // Every rank blames a rank whose call differs from its own.
        int culprit = r.hostResult()->culprit;
        CHILD_CHECK(rank == 1 ? culprit != 1 : culprit == 1);
        for (int it = 1; it <= 4; ++it) {
            if (int rc = runSums(r, d_in, d_out, 4096, static_cast<uint64_t>(it), it, 3); rc != 0)
                return rc;
        }
        CHILD_OK(barrier(*r.store, "end", 3));
        return 0;
    });
}

TEST(DeviceAllReduceFailures, SilentPeerTimesOutAndTheSurvivorsGoOnInANewEpoch) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(3, [&](int rank) {
        Rank r;
        if (int rc = setUp(r, dir.path(), rank, 3, kSlotBytes); rc != 0)
            return rc;
        if (rank == 2) {  // alive, mapped, but never calls
            CHILD_CHECK(!te::shm_test::waitKey(*r.store, "survivors/done").empty());
            return 0;
        }
        float *d_in = nullptr, *d_out = nullptr;
        CUDA_CHILD_OK(cudaMalloc(&d_in, 4096 * sizeof(float)));
        CUDA_CHILD_OK(cudaMalloc(&d_out, 4096 * sizeof(float)));
        r.view.timeout_ns = 2'000'000'000;
        r.clearResult();
        CHILD_OK(oneShotAllReduce(r.view, d_in, d_out, 4096, DataType::kFloat32, ReduceOp::kSum, 0,
                                  r.deviceResult(), r.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));  // the kernel returned: no hang, no trap
        CHILD_CHECK(r.hostResult()->status == static_cast<int32_t>(DeviceStatus::kTimeout));
        CHILD_CHECK(r.hostResult()->culprit == 2);
        CUDA_CHILD_OK(cudaGetLastError());
        // The survivors continue as a group of two in epoch 2.
        r.view.size = 2;
        r.view.epoch = 2;
        r.setCurrentEpoch(2);
        CHILD_OK(barrier(*r.store, "epoch2", 2));
        for (int it = 0; it < 3; ++it) {
            if (int rc = runSums(r, d_in, d_out, 4096, static_cast<uint64_t>(it), it, 2); rc != 0)
                return rc;
        }
        CHILD_OK(barrier(*r.store, "survivors", 2));
        if (rank == 0)
            CHILD_OK(r.store->set("survivors/done", "1"));
        return 0;
    });
}

TEST(DeviceAllReduceFailures, AbortWordEndsAnUnboundedWait) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(2, [&](int rank) {
        Rank r;
        if (int rc = setUp(r, dir.path(), rank, 2, kSlotBytes); rc != 0)
            return rc;
        if (rank == 1) {
            // Never calls; tells rank 0 once rank 0's push has landed here, so
            // rank 0 aborts a call that is past its push.
            uint64_t flag = 0;
            Deadline deadline = Deadline::afterMs(kWaitMs);
            while (flag == 0 && !deadline.expired()) {
                CUDA_CHILD_OK(
                    cudaMemcpy(&flag, r.window + flagOffset(0, 0), 8, cudaMemcpyDeviceToHost));
            }
            CHILD_CHECK(flag == stepTag(1, 0, 0));
            CHILD_OK(r.store->set("pushed", "1"));
            CHILD_CHECK(!te::shm_test::waitKey(*r.store, "aborted").empty());
            return 0;
        }
        float *d_in = nullptr, *d_out = nullptr;
        CUDA_CHILD_OK(cudaMalloc(&d_in, 1024 * sizeof(float)));
        CUDA_CHILD_OK(cudaMalloc(&d_out, 1024 * sizeof(float)));
        r.view.timeout_ns = -1;  // only the abort word can end this call
        r.clearResult();
        CHILD_OK(oneShotAllReduce(r.view, d_in, d_out, 1024, DataType::kFloat32, ReduceOp::kSum, 0,
                                  r.deviceResult(), r.stream));
        CHILD_CHECK(!te::shm_test::waitKey(*r.store, "pushed").empty());
        r.setAbort(7);
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
        CHILD_CHECK(r.hostResult()->status == static_cast<int32_t>(DeviceStatus::kAborted));
        CHILD_CHECK(r.hostResult()->detail == 7);
        CHILD_CHECK(r.hostResult()->culprit == 1);
        CHILD_OK(r.store->set("aborted", "1"));
        return 0;
    });
}

TEST(DeviceAllReduceFailures, StaleEpochTouchesNoPeer) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(2, [&](int rank) {
        Rank r;
        if (int rc = setUp(r, dir.path(), rank, 2, kSlotBytes); rc != 0)
            return rc;
        if (rank == 1) {
            CHILD_CHECK(!te::shm_test::waitKey(*r.store, "called").empty());
            std::vector<char> header(kWindowHeaderBytes);
            CUDA_CHILD_OK(
                cudaMemcpy(header.data(), r.window, header.size(), cudaMemcpyDeviceToHost));
            for (char c : header)
                CHILD_CHECK(c == 0);
            return 0;
        }
        float *d_in = nullptr, *d_out = nullptr;
        CUDA_CHILD_OK(cudaMalloc(&d_in, 1024 * sizeof(float)));
        CUDA_CHILD_OK(cudaMalloc(&d_out, 1024 * sizeof(float)));
        r.setCurrentEpoch(2);  // the membership moved on; the call is of epoch 1
        r.clearResult();
        CHILD_OK(oneShotAllReduce(r.view, d_in, d_out, 1024, DataType::kFloat32, ReduceOp::kSum, 0,
                                  r.deviceResult(), r.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
        CHILD_CHECK(r.hostResult()->status == static_cast<int32_t>(DeviceStatus::kStaleEpoch));
        CHILD_OK(r.store->set("called", "1"));
        return 0;
    });
}

}  // namespace
}  // namespace mooncake::pg::device::test
