// The direct collectives between processes on the one GPU: every member's own
// buffers are shared (peer_buffers.h: descriptors through the store here, the
// host core in the backend) and no byte goes through the windows. Exact
// all_reduce results for every dtype and op on constructed inputs, out of
// place (aligned and not) and in place, a message of many grid passes;
// reduce_scatter, all_gather and all_to_all exact at odd sizes; and the
// bounds check of a peer's descriptor, which needs no GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/reduce_scatter.h"
#include "tests/cpp/pg_device/device_group_util.h"
#include "tests/cpp/pg_device/reduce_reference.h"
#include "tests/cpp/pg_device/run_ranks.h"

namespace mooncake::pg::device::test {
namespace {

// The windows carry only flags on this path.
constexpr uint64_t kSlotBytes = 4096;

template <typename T>
int checkOne(Rank& r, Sharing& s, DataType dtype, ReduceOp op, size_t count, T* d_in, T* d_out,
             uint64_t seq) {
    std::unique_ptr<T[]> in(new T[count]), out(new T[count]);
    for (size_t i = 0; i < count; ++i)
        in[i] = inputElement<T>(op, r.rank, i);
    CUDA_CHILD_OK(
        cudaMemcpyAsync(d_in, in.get(), count * sizeof(T), cudaMemcpyHostToDevice, r.stream));
    MemberBuffers b;
    if (int rc = shareMemberBuffers(r, s, std::to_string(seq), d_in, d_out, count * sizeof(T), &b);
        rc != 0)
        return rc;
    r.clearResult();
    CHILD_OK(directAllReduce(r.view, b, count, dtype, op, seq, r.deviceResult(), r.stream));
    CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
    CHILD_CHECK(r.hostResult()->status == 0);
    CUDA_CHILD_OK(cudaMemcpy(out.get(), d_out, count * sizeof(T), cudaMemcpyDeviceToHost));
    if (size_t i = firstWrongElement(out.get(), op, r.size, 0, count); i < count) {
        std::fprintf(stderr, "rank %d dtype %s op %s count %zu element %zu differs\n", r.rank,
                     dataTypeName(dtype), reduceOpName(op), count, i);
        return 1;
    }
    return 0;
}

template <typename T>
int checkDtype(Rank& r, Sharing& s, DataType dtype, uint64_t* seq) {
    constexpr size_t kCount = 1003;  // an odd tail after the 16-byte vectors
    return forEachSupportedOp<T>(dtype, kCount + 1, [&](T* d_in, T* d_out, ReduceOp op) {
        // Out of place aligned, one element in (unaligned for all but
        // bytes), in place.
        int rc = checkOne<T>(r, s, dtype, op, kCount, d_in, d_out, (*seq)++);
        if (rc == 0)
            rc = checkOne<T>(r, s, dtype, op, kCount, d_in + 1, d_out + 1, (*seq)++);
        return rc != 0 ? rc : checkOne<T>(r, s, dtype, op, kCount, d_out, d_out, (*seq)++);
    });
}

int everyDtypeAndOp(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    Sharing s;
    uint64_t seq = 0;
    int rc = forEachDtype([&](auto type, DataType dtype) {
        return checkDtype<typename decltype(type)::type>(r, s, dtype, &seq);
    });
    if (rc == 0) {
        // Many grid passes per piece, and a piece boundary inside a vector.
        constexpr size_t kLarge = (size_t{3} << 20) + 5;
        float* d_in = nullptr;
        float* d_out = nullptr;
        CUDA_CHILD_OK(cudaMalloc(&d_in, kLarge * sizeof(float)));
        CUDA_CHILD_OK(cudaMalloc(&d_out, kLarge * sizeof(float)));
        rc = checkOne<float>(r, s, DataType::kFloat32, ReduceOp::kSum, kLarge, d_in, d_out, seq++);
        cudaFree(d_in);
        cudaFree(d_out);
    }
    if (rc == 0)
        CHILD_OK(barrier(*r.store, "end", size));
    // Every mapping closed before the peers free their buffers.
    s.peers.clear();
    if (rc == 0)
        CHILD_OK(barrier(*r.store, "unmapped", size));
    return rc;
}

// reduce_scatter: rank r gets block r of the members' inputs reduced;
// all_gather: every rank gets every member's input in rank order. Returns 0
// or a failing exit code.
template <typename T>
int reduceScatterOnce(Rank& r, Sharing& s, DataType dtype, ReduceOp op, size_t count,
                      uint64_t seq) {
    const size_t total = count * r.size;
    std::unique_ptr<T[]> in(new T[total]), out(new T[count]);
    for (size_t i = 0; i < total; ++i)
        in[i] = inputElement<T>(op, r.rank, i);
    T* d_in = nullptr;
    T* d_out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&d_in, total * sizeof(T)));
    CUDA_CHILD_OK(cudaMalloc(&d_out, count * sizeof(T)));
    CUDA_CHILD_OK(cudaMemcpy(d_in, in.get(), total * sizeof(T), cudaMemcpyHostToDevice));
    MemberBuffers b;
    // The inputs are shared whole; the output is read by nobody.
    int rc =
        shareMemberBuffers(r, s, "rs" + std::to_string(seq), d_in, d_in, total * sizeof(T), &b);
    b.outputs[r.rank] = d_out;
    if (rc == 0) {
        r.clearResult();
        CHILD_OK(directReduceScatter(r.view, b, count, dtype, op, seq, r.deviceResult(), r.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
        CHILD_CHECK(r.hostResult()->status == 0);
        CUDA_CHILD_OK(cudaMemcpy(out.get(), d_out, count * sizeof(T), cudaMemcpyDeviceToHost));
        if (size_t i = firstWrongElement(out.get(), op, r.size, r.rank * count, count); i < count) {
            std::fprintf(stderr, "rank %d reduce_scatter %s %s element %zu differs\n", r.rank,
                         dataTypeName(dtype), reduceOpName(op), i);
            rc = 1;
        }
    }
    // Nobody reads this rank's input once every member's call completed.
    CHILD_OK(barrier(*r.store, "rs_done" + std::to_string(seq), r.size));
    cudaFree(d_in);
    cudaFree(d_out);
    return rc;
}

enum class BlockMove { kAllGather, kAllToAll };

// all_gather: block p of every rank's output is rank p's input of `bytes`;
// all_to_all: it is block `rank` of rank p's input of size blocks. Returns 0
// or a failing exit code.
int blockMoveOnce(Rank& r, Sharing& s, BlockMove move, size_t bytes, uint64_t seq) {
    const auto pattern = [](int rank, size_t i) {
        return static_cast<uint8_t>((rank * 37 + i * 7) % 251);
    };
    const size_t in_bytes = move == BlockMove::kAllGather ? bytes : bytes * r.size;
    std::vector<uint8_t> in(in_bytes), out(bytes * r.size);
    for (size_t i = 0; i < in_bytes; ++i)
        in[i] = pattern(r.rank, i);
    uint8_t* d_in = nullptr;
    uint8_t* d_out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&d_in, in_bytes));
    CUDA_CHILD_OK(cudaMalloc(&d_out, bytes * r.size));
    CUDA_CHILD_OK(cudaMemcpy(d_in, in.data(), in_bytes, cudaMemcpyHostToDevice));
    MemberBuffers b;
    int rc = shareMemberBuffers(r, s, "bm" + std::to_string(seq), d_in, d_in, in_bytes, &b);
    b.outputs[r.rank] = d_out;
    const char* name = move == BlockMove::kAllGather ? "all_gather" : "all_to_all";
    if (rc == 0) {
        r.clearResult();
        if (move == BlockMove::kAllGather) {
            CHILD_OK(directAllGather(r.view, b, bytes, DataType::kUInt8, seq, r.deviceResult(),
                                     r.stream));
        } else {
            CHILD_OK(directAllToAll(r.view, b, bytes, DataType::kUInt8, seq, r.deviceResult(),
                                    r.stream));
        }
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
        CHILD_CHECK(r.hostResult()->status == 0);
        CUDA_CHILD_OK(cudaMemcpy(out.data(), d_out, bytes * r.size, cudaMemcpyDeviceToHost));
        const size_t from = move == BlockMove::kAllGather ? 0 : r.rank * bytes;
        for (int p = 0; p < r.size && rc == 0; ++p) {
            for (size_t i = 0; i < bytes; ++i) {
                if (out[p * bytes + i] != pattern(p, from + i)) {
                    std::fprintf(stderr, "rank %d %s block %d byte %zu differs\n", r.rank, name, p,
                                 i);
                    rc = 1;
                    break;
                }
            }
        }
    }
    CHILD_OK(barrier(*r.store, "bm_done" + std::to_string(seq), r.size));
    cudaFree(d_in);
    cudaFree(d_out);
    return rc;
}

int scatterAndGather(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    Sharing s;
    uint64_t seq = 0;
    int rc = 0;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
        if (rc == 0)
            rc = reduceScatterOnce<float>(r, s, DataType::kFloat32, op, 1003, seq++);
        if (rc == 0)
            rc = reduceScatterOnce<__nv_bfloat16>(r, s, DataType::kBFloat16, op, 4099, seq++);
    }
    if (rc == 0)
        rc = reduceScatterOnce<int64_t>(r, s, DataType::kInt64, ReduceOp::kBxor, 777, seq++);
    // Odd sizes (no 16-byte vectors), then many grid passes.
    for (BlockMove move : {BlockMove::kAllGather, BlockMove::kAllToAll}) {
        for (size_t bytes : {size_t{1}, size_t{4097}, size_t{5} << 20}) {
            if (rc == 0)
                rc = blockMoveOnce(r, s, move, bytes, seq++);
        }
    }
    s.peers.clear();
    if (rc == 0)
        CHILD_OK(barrier(*r.store, "unmapped", size));
    return rc;
}

class DeviceDirectAllReduce : public ::testing::TestWithParam<int> {};

TEST_P(DeviceDirectAllReduce, EveryDtypeAndOpIsExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) { return everyDtypeAndOp(dir.path(), rank, size); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceDirectAllReduce, ::testing::Values(2, 3, 4));

class DeviceDirectScatterGather : public ::testing::TestWithParam<int> {};

TEST_P(DeviceDirectScatterGather, ReduceScatterAllGatherAndAllToAllAreExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) { return scatterAndGather(dir.path(), rank, size); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceDirectScatterGather, ::testing::Values(2, 3, 4));

// Argument checks come before any CUDA call, so they run without a GPU on a
// view whose windows are plain host memory.
TEST(DeviceDirectArguments, AllReduceRefusesAnOutputThatOverlapsItsInputWithoutBeingIt) {
    constexpr int kSize = 2;
    constexpr size_t kCount = 64;
    std::vector<char> windows(kSize * 4096);
    uint64_t abort_word = 0, epoch = 1;
    DeviceOpResult result{};
    DeviceGroupView view;
    view.rank = 0;
    view.size = kSize;
    view.slot_bytes = kSlotBytes;
    view.epoch = epoch;
    view.abort_word = &abort_word;
    view.current_epoch = &epoch;
    for (int r = 0; r < kSize; ++r)
        view.windows[r] = windows.data() + r * 4096;
    std::vector<float> buffers(kSize * 2 * kCount);
    MemberBuffers b;
    for (int r = 0; r < kSize; ++r) {
        b.inputs[r] = buffers.data() + r * 2 * kCount;
        b.outputs[r] = buffers.data() + r * 2 * kCount;  // in place: allowed
    }
    // Rank 1's output starts one element into its input.
    b.outputs[1] = buffers.data() + 2 * kCount + 1;
    const Status s =
        directAllReduce(view, b, kCount, DataType::kFloat32, ReduceOp::kSum, 0, &result, nullptr);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("rank 1's output overlaps its input without being it"),
              std::string::npos)
        << s.message();
}

TEST(PeerBufferMappings, RejectsADescriptorOutsideItsAllocation) {
    PeerBufferMappings peers;
    BufferDescriptor d;
    d.allocation_id = 7;
    d.allocation_bytes = 4096;
    d.offset = 4000;
    auto past_end = peers.map("rank1", d, 97);
    ASSERT_FALSE(past_end.ok());
    EXPECT_EQ(past_end.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(past_end.status().message().find("97 bytes at offset 4000"), std::string::npos)
        << past_end.status().message();
    d.offset = ~uint64_t{0};  // would wrap around
    EXPECT_EQ(peers.map("rank1", d, 1).status().code(), StatusCode::kInvalidArgument);
    BufferDescriptor unshared;
    EXPECT_EQ(peers.map("rank1", unshared, 0).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(peers.size(), 0u);
}

}  // namespace
}  // namespace mooncake::pg::device::test
