// The chunked device collectives between processes on the one GPU, exact
// against a host reference at 2, 3 and 4 ranks: all_gather, all_to_all,
// broadcast, gather and scatter on byte patterns (aligned and unaligned buffers and lengths,
// messages many slots long), reduce_scatter and the two-shot all_reduce for
// every dtype and op (reduce_reference.h), allReduce's choice on both sides
// of its threshold, and in-place calls. Skips with the reason where no GPU
// is usable.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/broadcast.h"
#include "mooncake-pg/device/reduce_scatter.h"
#include "tests/cpp/pg_device/device_group_util.h"
#include "tests/cpp/pg_device/reduce_reference.h"
#include "tests/cpp/pg_device/run_ranks.h"

namespace mooncake::pg::device::test {
namespace {

// Small slots, so that every message below spans several chunks.
constexpr uint64_t kSlotBytes = 512;

uint8_t pattern(int rank, uint64_t i, uint64_t salt) {
    return static_cast<uint8_t>((rank + 1) * 131 + i * 7 + (i >> 8) * 13 + salt * 29);
}

// Waits for the call and checks it succeeded and marked its end.
int finish(Rank& r, const char* what) {
    CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
    const DeviceOpResult res = *r.hostResult();
    if (res.status != 0) {
        std::fprintf(stderr, "rank %d %s: status %d culprit %d detail %llu\n", r.rank, what,
                     res.status, res.culprit, static_cast<unsigned long long>(res.detail));
        return 1;
    }
    // The worker completes a call from this mark (pollKernelCalls).
    if (res.ended == 0) {
        std::fprintf(stderr, "rank %d %s: the call ended without its end mark\n", r.rank, what);
        return 1;
    }
    return 0;
}

int compareBytes(const Rank& r, const char* what, const std::vector<uint8_t>& got,
                 const std::vector<uint8_t>& want) {
    for (size_t i = 0; i < want.size(); ++i) {
        if (got[i] != want[i]) {
            std::fprintf(stderr, "rank %d %s: byte %zu is %u, expected %u\n", r.rank, what, i,
                         got[i], want[i]);
            return 1;
        }
    }
    return 0;
}

struct MoveCase {
    DataType dtype;
    size_t count;
    size_t offset_bytes;  // into the device buffers: 0 is 256-byte aligned
};

// Element counts and offsets: odd lengths, byte- and word-aligned buffers,
// and messages of many chunks (16 KiB against 512-byte slots).
constexpr MoveCase kMoveCases[] = {
    {DataType::kUInt8, 1003, 0},
    {DataType::kUInt8, 999, 1},
    {DataType::kFloat32, 1000, 4},
    {DataType::kInt64, 2048, 0},
};

struct Buffers {
    char* in = nullptr;
    char* out = nullptr;
    ~Buffers() {
        cudaFree(in);
        cudaFree(out);
    }
};

int allocate(Buffers& b, size_t bytes) {
    CUDA_CHILD_OK(cudaMalloc(&b.in, bytes + 64));
    CUDA_CHILD_OK(cudaMalloc(&b.out, bytes + 64));
    return 0;
}

int upload(Rank& r, char* dst, const std::vector<uint8_t>& host) {
    // On the call's stream: a pageable copy may return before its DMA lands.
    CUDA_CHILD_OK(cudaMemcpyAsync(dst, host.data(), host.size(), cudaMemcpyHostToDevice, r.stream));
    return 0;
}

int download(std::vector<uint8_t>* host, const char* src) {
    CUDA_CHILD_OK(cudaMemcpy(host->data(), src, host->size(), cudaMemcpyDeviceToHost));
    return 0;
}

int checkAllGather(Rank& r, const MoveCase& c, uint64_t seq) {
    const uint64_t bytes = c.count * dataTypeSize(c.dtype);
    Buffers b;
    if (int rc = allocate(b, bytes * r.size + c.offset_bytes); rc != 0)
        return rc;
    std::vector<uint8_t> in(bytes), out(bytes * r.size), want(bytes * r.size);
    for (uint64_t i = 0; i < bytes; ++i)
        in[i] = pattern(r.rank, i, seq);
    for (int s = 0; s < r.size; ++s) {
        for (uint64_t i = 0; i < bytes; ++i)
            want[s * bytes + i] = pattern(s, i, seq);
    }
    if (int rc = upload(r, b.in + c.offset_bytes, in); rc != 0)
        return rc;
    r.clearResult();
    CHILD_OK(allGather(r.view, b.in + c.offset_bytes, b.out + c.offset_bytes, c.count, c.dtype, seq,
                       r.deviceResult(), r.stream));
    if (int rc = finish(r, "all_gather"); rc != 0)
        return rc;
    if (int rc = download(&out, b.out + c.offset_bytes); rc != 0)
        return rc;
    return compareBytes(r, "all_gather", out, want);
}

int checkAllToAll(Rank& r, const MoveCase& c, uint64_t seq, bool in_place) {
    const uint64_t bytes = c.count * dataTypeSize(c.dtype);
    Buffers b;
    if (int rc = allocate(b, bytes * r.size + c.offset_bytes); rc != 0)
        return rc;
    std::vector<uint8_t> in(bytes * r.size), out(bytes * r.size), want(bytes * r.size);
    for (uint64_t i = 0; i < bytes * r.size; ++i)
        in[i] = pattern(r.rank, i, seq);
    for (int s = 0; s < r.size; ++s) {
        for (uint64_t i = 0; i < bytes; ++i)
            want[s * bytes + i] = pattern(s, r.rank * bytes + i, seq);
    }
    char* out_ptr = (in_place ? b.in : b.out) + c.offset_bytes;
    if (int rc = upload(r, b.in + c.offset_bytes, in); rc != 0)
        return rc;
    r.clearResult();
    CHILD_OK(allToAll(r.view, b.in + c.offset_bytes, out_ptr, c.count, c.dtype, seq,
                      r.deviceResult(), r.stream));
    if (int rc = finish(r, "all_to_all"); rc != 0)
        return rc;
    if (int rc = download(&out, out_ptr); rc != 0)
        return rc;
    return compareBytes(r, in_place ? "in-place all_to_all" : "all_to_all", out, want);
}

int checkBroadcast(Rank& r, const MoveCase& c, int root, uint64_t seq) {
    const uint64_t bytes = c.count * dataTypeSize(c.dtype);
    Buffers b;
    if (int rc = allocate(b, bytes + c.offset_bytes); rc != 0)
        return rc;
    std::vector<uint8_t> in(bytes, 0xee), out(bytes), want(bytes);
    for (uint64_t i = 0; i < bytes; ++i) {
        want[i] = pattern(root, i, seq);
        if (r.rank == root)
            in[i] = want[i];
    }
    if (int rc = upload(r, b.in + c.offset_bytes, in); rc != 0)
        return rc;
    r.clearResult();
    CHILD_OK(broadcast(r.view, b.in + c.offset_bytes, c.count, c.dtype, root, seq, r.deviceResult(),
                       r.stream));
    if (int rc = finish(r, "broadcast"); rc != 0)
        return rc;
    if (int rc = download(&out, b.in + c.offset_bytes); rc != 0)
        return rc;
    return compareBytes(r, "broadcast", out, want);
}

// Non-roots' outputs keep their bytes (0xee): gather writes only the root's.
int checkGather(Rank& r, const MoveCase& c, int root, uint64_t seq) {
    const uint64_t bytes = c.count * dataTypeSize(c.dtype);
    Buffers b;
    if (int rc = allocate(b, bytes * r.size + c.offset_bytes); rc != 0)
        return rc;
    std::vector<uint8_t> in(bytes), out(bytes * r.size), want(bytes * r.size, 0xee);
    for (uint64_t i = 0; i < bytes; ++i)
        in[i] = pattern(r.rank, i, seq);
    for (int s = 0; s < r.size && r.rank == root; ++s) {
        for (uint64_t i = 0; i < bytes; ++i)
            want[s * bytes + i] = pattern(s, i, seq);
    }
    if (int rc = upload(r, b.in + c.offset_bytes, in); rc != 0)
        return rc;
    if (int rc = upload(r, b.out + c.offset_bytes, std::vector<uint8_t>(bytes * r.size, 0xee));
        rc != 0)
        return rc;
    r.clearResult();
    CHILD_OK(gather(r.view, b.in + c.offset_bytes, b.out + c.offset_bytes, c.count, c.dtype, root,
                    seq, r.deviceResult(), r.stream));
    if (int rc = finish(r, "gather"); rc != 0)
        return rc;
    if (int rc = download(&out, b.out + c.offset_bytes); rc != 0)
        return rc;
    return compareBytes(r, "gather", out, want);
}

// Only the root's input is read: the others' holds a decoy.
int checkScatter(Rank& r, const MoveCase& c, int root, uint64_t seq) {
    const uint64_t bytes = c.count * dataTypeSize(c.dtype);
    Buffers b;
    if (int rc = allocate(b, bytes * r.size + c.offset_bytes); rc != 0)
        return rc;
    std::vector<uint8_t> in(bytes * r.size), out(bytes), want(bytes);
    for (uint64_t i = 0; i < bytes * r.size; ++i)
        in[i] = pattern(r.rank == root ? root : r.size + r.rank, i, seq);
    for (uint64_t i = 0; i < bytes; ++i)
        want[i] = pattern(root, r.rank * bytes + i, seq);
    if (int rc = upload(r, b.in + c.offset_bytes, in); rc != 0)
        return rc;
    r.clearResult();
    CHILD_OK(scatter(r.view, b.in + c.offset_bytes, b.out + c.offset_bytes, c.count, c.dtype, root,
                     seq, r.deviceResult(), r.stream));
    if (int rc = finish(r, "scatter"); rc != 0)
        return rc;
    if (int rc = download(&out, b.out + c.offset_bytes); rc != 0)
        return rc;
    return compareBytes(r, "scatter", out, want);
}

int dataMovement(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    uint64_t seq = 0;
    for (const MoveCase& c : kMoveCases) {
        if (int rc = checkAllGather(r, c, seq++); rc != 0)
            return rc;
        for (bool in_place : {false, true}) {
            if (int rc = checkAllToAll(r, c, seq++, in_place); rc != 0)
                return rc;
        }
        for (int root = 0; root < size; ++root) {
            if (int rc = checkBroadcast(r, c, root, seq++); rc != 0)
                return rc;
            if (int rc = checkGather(r, c, root, seq++); rc != 0)
                return rc;
            if (int rc = checkScatter(r, c, root, seq++); rc != 0)
                return rc;
        }
    }
    CHILD_OK(barrier(*r.store, "end", size));
    return 0;
}

enum class Reducing { kReduceScatter, kTwoShot, kTwoShotInPlace };

// One reducing call of `count` elements per result block at `offset`
// elements into the device buffers; checks every element.
template <typename T>
int checkReduce(Rank& r, Reducing kind, DataType dtype, ReduceOp op, size_t count, size_t offset,
                uint64_t seq, T* d_in, T* d_out) {
    // Input element i: block i / count for reduce_scatter, i itself for
    // all_reduce; the reference's index is the element's index in the input.
    const size_t in_count = kind == Reducing::kReduceScatter ? count * r.size : count;
    std::unique_ptr<T[]> in(new T[in_count]), out(new T[count]);
    for (size_t i = 0; i < in_count; ++i)
        in[i] = inputElement<T>(op, r.rank, i);
    CUDA_CHILD_OK(cudaMemcpyAsync(d_in + offset, in.get(), in_count * sizeof(T),
                                  cudaMemcpyHostToDevice, r.stream));
    r.clearResult();
    T* result_ptr = (kind == Reducing::kTwoShotInPlace ? d_in : d_out) + offset;
    if (kind == Reducing::kReduceScatter) {
        CHILD_OK(reduceScatter(r.view, d_in + offset, result_ptr, count, dtype, op, seq,
                               r.deviceResult(), r.stream));
    } else {
        CHILD_OK(twoShotAllReduce(r.view, d_in + offset, result_ptr, count, dtype, op, seq,
                                  r.deviceResult(), r.stream));
    }
    if (int rc = finish(r, "reduction"); rc != 0)
        return rc;
    CUDA_CHILD_OK(cudaMemcpy(out.get(), result_ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    const size_t first = kind == Reducing::kReduceScatter ? r.rank * count : 0;
    if (size_t i = firstWrongElement(out.get(), op, r.size, first, count); i < count) {
        std::fprintf(stderr, "rank %d kind %d dtype %s op %s offset %zu element %zu differs\n",
                     r.rank, static_cast<int>(kind), dataTypeName(dtype), reduceOpName(op), offset,
                     i);
        return 1;
    }
    return 0;
}

template <typename T>
int reduceEveryOp(Rank& r, Reducing kind, DataType dtype, uint64_t* seq) {
    // 301 elements: an odd tail after the vectors, several slots long for
    // every element size (64 doubles to 512 bytes a slot).
    constexpr size_t kCount = 301;
    const size_t in_count = (kind == Reducing::kReduceScatter ? kCount * r.size : kCount) + 1;
    return forEachSupportedOp<T>(dtype, in_count, [&](T* d_in, T* d_out, ReduceOp op) {
        int rc = checkReduce<T>(r, kind, dtype, op, kCount, 0, (*seq)++, d_in, d_out);
        return rc != 0 ? rc : checkReduce<T>(r, kind, dtype, op, kCount, 1, (*seq)++, d_in, d_out);
    });
}

int reductions(const std::string& dir, int rank, int size, Reducing kind) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    uint64_t seq = 0;
    const int rc = forEachDtype([&](auto type, DataType dtype) {
        return reduceEveryOp<typename decltype(type)::type>(r, kind, dtype, &seq);
    });
    if (rc == 0)
        CHILD_OK(barrier(*r.store, "end", size));
    return rc;
}

// allReduce on both sides of its choice: a message that fits a slot (the
// one-shot) and one of many chunks (the two-shot), back to back.
int allReduceChoice(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, kSlotBytes); rc != 0)
        return rc;
    const size_t counts[] = {kSlotBytes / sizeof(float), 5000, 7, 4099};
    float *d_in = nullptr, *d_out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&d_in, 5000 * sizeof(float)));
    CUDA_CHILD_OK(cudaMalloc(&d_out, 5000 * sizeof(float)));
    uint64_t seq = 0;
    for (size_t count : counts) {
        std::vector<float> in(count), out(count);
        for (size_t i = 0; i < count; ++i)
            in[i] = inputElement<float>(ReduceOp::kSum, rank, i);
        CUDA_CHILD_OK(cudaMemcpyAsync(d_in, in.data(), count * sizeof(float),
                                      cudaMemcpyHostToDevice, r.stream));
        r.clearResult();
        CHILD_OK(allReduce(r.view, d_in, d_out, count, DataType::kFloat32, ReduceOp::kSum, seq++,
                           r.deviceResult(), r.stream));
        if (int rc = finish(r, "allReduce"); rc != 0)
            return rc;
        CUDA_CHILD_OK(cudaMemcpy(out.data(), d_out, count * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; ++i)
            CHILD_CHECK(out[i] == expectedElement<float>(ReduceOp::kSum, size, i));
    }
    cudaFree(d_in);
    cudaFree(d_out);
    CHILD_OK(barrier(*r.store, "end", size));
    return 0;
}

class DeviceCollectives : public ::testing::TestWithParam<int> {};

TEST_P(DeviceCollectives, AllGatherAllToAllBroadcastGatherAndScatterAreExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) { return dataMovement(dir.path(), rank, size); });
}

TEST_P(DeviceCollectives, ReduceScatterEveryDtypeAndOpIsExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) {
        return reductions(dir.path(), rank, size, Reducing::kReduceScatter);
    });
}

TEST_P(DeviceCollectives, TwoShotAllReduceEveryDtypeAndOpIsExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size,
             [&](int rank) { return reductions(dir.path(), rank, size, Reducing::kTwoShot); });
}

TEST_P(DeviceCollectives, TwoShotAllReduceInPlaceIsExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) {
        return reductions(dir.path(), rank, size, Reducing::kTwoShotInPlace);
    });
}

TEST_P(DeviceCollectives, AllReducePicksOneShotOrTwoShotBySize) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) { return allReduceChoice(dir.path(), rank, size); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceCollectives, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace mooncake::pg::device::test
