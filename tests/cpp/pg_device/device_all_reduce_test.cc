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

namespace mooncake::pg::device::test {
namespace {

constexpr uint64_t kSlotBytes = 1 << 20;

// Inputs chosen so every dtype represents every partial result exactly
// (small integers, products of ones and twos), so the expected value is
// plain integer arithmetic.
int64_t inputValue(ReduceOp op, int rank, size_t i) {
    switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
            return (rank + 1) * static_cast<int64_t>(i % 5 + 1);
        case ReduceOp::kProduct:
            return 1 + static_cast<int64_t>((rank + i) % 2);
        case ReduceOp::kMin:
        case ReduceOp::kMax:
            return static_cast<int64_t>((rank * 3 + i) % 11);
        default:
            return static_cast<int64_t>(((rank + 1) * 37 + i) & 0x7f);
    }
}

int64_t expectedValue(ReduceOp op, int size, size_t i) {
    int64_t acc = inputValue(op, 0, i);
    for (int r = 1; r < size; ++r) {
        int64_t v = inputValue(op, r, i);
        switch (op) {
            case ReduceOp::kSum:
            case ReduceOp::kAvg:
                acc += v;
                break;
            case ReduceOp::kProduct:
                acc *= v;
                break;
            case ReduceOp::kMin:
                acc = std::min(acc, v);
                break;
            case ReduceOp::kMax:
                acc = std::max(acc, v);
                break;
            case ReduceOp::kBand:
                acc &= v;
                break;
            case ReduceOp::kBor:
                acc |= v;
                break;
            case ReduceOp::kBxor:
                acc ^= v;
                break;
        }
    }
    return acc;
}

template <typename T>
T fromInt(int64_t v) {
    if constexpr (std::is_same_v<T, __half>)
        return __float2half_rn(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, bool>)
        return v != 0;
    else
        return static_cast<T>(v);
}

// AVG of exact integer sums, rounded once to T as the device does.
template <typename T>
T averageOf(int64_t sum, int n) {
    if constexpr (std::is_same_v<T, double>)
        return static_cast<double>(sum) / n;
    float avg = static_cast<float>(sum) / static_cast<float>(n);
    if constexpr (std::is_same_v<T, __half>)
        return __float2half_rn(avg);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(avg);
    else
        return static_cast<T>(avg);
}

template <typename T>
bool sameBits(const T& a, const T& b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// One all_reduce of `count` elements of T with op, at `offset` elements into
// the device buffers; checks every element. Returns 0 or a failing code.
template <typename T>
int checkOne(Rank& r, DataType dtype, ReduceOp op, size_t count, size_t offset, uint64_t seq,
             T* d_in, T* d_out) {
    // Not std::vector: vector<bool> has no contiguous storage.
    std::unique_ptr<T[]> in(new T[count]), out(new T[count]);
    for (size_t i = 0; i < count; ++i) {
        int64_t v = inputValue(op, r.rank, i);
        in[i] = std::is_same_v<T, bool> ? fromInt<T>(v % 2) : fromInt<T>(v);
    }
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
    for (size_t i = 0; i < count; ++i) {
        T expect;
        if constexpr (std::is_same_v<T, bool>) {
            bool acc = inputValue(op, 0, i) % 2;
            for (int s = 1; s < r.size; ++s) {
                bool v = inputValue(op, s, i) % 2;
                if (op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kBor)
                    acc = acc || v;
                else if (op == ReduceOp::kBxor)
                    acc = acc != v;
                else
                    acc = acc && v;
            }
            expect = acc;
        } else if (op == ReduceOp::kAvg) {
            expect = averageOf<T>(expectedValue(op, r.size, i), r.size);
        } else {
            expect = fromInt<T>(expectedValue(op, r.size, i));
        }
        if (!sameBits(out[i], expect)) {
            std::fprintf(stderr, "rank %d dtype %s op %s element %zu differs\n", r.rank,
                         dataTypeName(dtype), reduceOpName(op), i);
            return 1;
        }
    }
    return 0;
}

template <typename T>
int checkDtype(Rank& r, DataType dtype, uint64_t* seq) {
    constexpr size_t kCount = 1003;  // an odd tail after the 16-byte vectors
    T* d_in = nullptr;
    T* d_out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&d_in, (kCount + 1) * sizeof(T)));
    CUDA_CHILD_OK(cudaMalloc(&d_out, (kCount + 1) * sizeof(T)));
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,
                            ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};
    int rc = 0;
    for (ReduceOp op : ops) {
        if (!reduceOpSupported(op, dtype, nullptr))
            continue;
        // Aligned, then one element in (unaligned for every type but bytes).
        for (size_t offset : {size_t{0}, size_t{1}}) {
            rc = checkOne<T>(r, dtype, op, kCount, offset, (*seq)++, d_in, d_out);
            if (rc != 0)
                break;
        }
        if (rc != 0)
            break;
    }
    cudaFree(d_in);
    cudaFree(d_out);
    return rc;
}

int everyDtypeAndOp(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    uint64_t seq = 0;
    int rc = 0;
    if (!rc)
        rc = checkDtype<float>(r, DataType::kFloat32, &seq);
    if (!rc)
        rc = checkDtype<double>(r, DataType::kFloat64, &seq);
    if (!rc)
        rc = checkDtype<__half>(r, DataType::kFloat16, &seq);
    if (!rc)
        rc = checkDtype<__nv_bfloat16>(r, DataType::kBFloat16, &seq);
    if (!rc)
        rc = checkDtype<int8_t>(r, DataType::kInt8, &seq);
    if (!rc)
        rc = checkDtype<uint8_t>(r, DataType::kUInt8, &seq);
    if (!rc)
        rc = checkDtype<int16_t>(r, DataType::kInt16, &seq);
    if (!rc)
        rc = checkDtype<int32_t>(r, DataType::kInt32, &seq);
    if (!rc)
        rc = checkDtype<int64_t>(r, DataType::kInt64, &seq);
    if (!rc)
        rc = checkDtype<bool>(r, DataType::kBool, &seq);
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
            CHILD_CHECK(flag == callTag(1, 0));
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
