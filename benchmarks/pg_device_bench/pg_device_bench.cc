// pg_device_bench: the device collectives (mooncake-pg/device) between N
// forked processes on the one GPU, each size next to the limit the device
// sets for the same work. Run it under MPS (scripts/gpu_check.sh starts it).
//
// Time per op: CUDA events around --iters back-to-back ops on every rank
// (after warmup ops), rank 0's reported; ranks line up at a barrier before
// every row. A row's size S is the larger side per rank (the input of
// all_reduce, reduce_scatter and all_to_all, the output of all_gather, the
// buffer of broadcast). The limit: a collective must read every input byte
// once and write every output byte once, over all ranks:
//   all_reduce (one-shot, two-shot, direct,   2 * N * S
//               chosen)
//   all_gather, reduce_scatter (window,       (N + 1) * S
//               direct)
//   all_to_all (window, direct)               2 * N * S
//   broadcast                                 N * S (root reads, others write)
// limit time = that traffic / the device copy bandwidth measured in the same
// run (a large cudaMemcpy D2D on rank 0 while the others wait, counting read
// + write); fraction = limit time / measured time.
//
// Prints one JSON object per line: the copy bandwidth, one per row, and the
// issue's targets as met or not: >= 60% of the limit with 2 processes and >=
// 50% with 4 at >= 64 MiB for all_reduce, all_gather, reduce_scatter and
// all_to_all (their direct rows: the backend's path at those sizes); an
// 8-byte all_reduce <= 20 us with 2 processes.
//
//   pg_device_bench [--ranks 2,4] [--min-bytes N] [--max-bytes N]
//                   [--slot-bytes N] [--iters N]   (N may end in K, M or G)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/broadcast.h"
#include "mooncake-pg/device/reduce_scatter.h"
#include "tests/cpp/pg_device/device_group_util.h"

namespace mooncake::pg::device::bench {
namespace {

using test::Rank;

struct Options {
    std::vector<int> ranks{2, 4};
    uint64_t min_bytes = 8;
    uint64_t max_bytes = uint64_t{1} << 30;
    uint64_t slot_bytes = uint64_t{64} << 20;
    int iters = 0;  // 0: by size
};

enum class Coll {
    kAllReduce,
    kOneShot,
    kTwoShot,
    kDirect,
    kAllGather,
    kReduceScatter,
    kAllToAll,
    kBroadcast,
    kDirectAllGather,
    kDirectReduceScatter,
    kDirectAllToAll
};
constexpr Coll kColls[] = {
    Coll::kAllReduce, Coll::kOneShot,         Coll::kTwoShot,       Coll::kDirect,
    Coll::kAllGather, Coll::kDirectAllGather, Coll::kReduceScatter, Coll::kDirectReduceScatter,
    Coll::kAllToAll,  Coll::kDirectAllToAll,  Coll::kBroadcast};

constexpr uint64_t kSizes[] = {8,           64,          1 << 10,      16 << 10,
                               64 << 10,    256 << 10,   1ull << 20,   4ull << 20,
                               16ull << 20, 64ull << 20, 256ull << 20, 1ull << 30};

const char* collName(Coll c) {
    switch (c) {
        case Coll::kAllReduce:
            return "all_reduce";
        case Coll::kOneShot:
            return "all_reduce_one_shot";
        case Coll::kTwoShot:
            return "all_reduce_two_shot";
        case Coll::kDirect:
            return "all_reduce_direct";
        case Coll::kAllGather:
            return "all_gather";
        case Coll::kReduceScatter:
            return "reduce_scatter";
        case Coll::kAllToAll:
            return "all_to_all";
        case Coll::kBroadcast:
            return "broadcast";
        case Coll::kDirectAllGather:
            return "all_gather_direct";
        case Coll::kDirectReduceScatter:
            return "reduce_scatter_direct";
        case Coll::kDirectAllToAll:
            return "all_to_all_direct";
    }
    return "?";
}

uint64_t parseBytes(const char* s) {
    char* end = nullptr;
    uint64_t v = std::strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    else if (*end == 'G' || *end == 'g')
        v <<= 30;
    return v;
}

// Total bytes the row must read and write over all ranks (see the top).
double trafficBytes(Coll c, int n, uint64_t s) {
    switch (c) {
        case Coll::kAllGather:
        case Coll::kReduceScatter:
        case Coll::kDirectAllGather:
        case Coll::kDirectReduceScatter:
            return static_cast<double>(n + 1) * s;
        case Coll::kBroadcast:
            return static_cast<double>(n) * s;
        default:
            return 2.0 * n * s;
    }
}

// Queues one op of the row's collective on S bytes per rank (float32 for the
// reductions, bytes otherwise). `members`: every rank's in and out, mapped.
Status queueOp(Coll c, Rank& r, char* in, char* out, const MemberBuffers& members, uint64_t s,
               uint64_t seq) {
    const int n = r.size;
    DeviceOpResult* res = r.deviceResult();
    switch (c) {
        case Coll::kAllReduce:
            return allReduce(r.view, in, out, s / 4, DataType::kFloat32, ReduceOp::kSum, seq, res,
                             r.stream);
        case Coll::kOneShot:
            return oneShotAllReduce(r.view, in, out, s / 4, DataType::kFloat32, ReduceOp::kSum, seq,
                                    res, r.stream);
        case Coll::kTwoShot:
            return twoShotAllReduce(r.view, in, out, s / 4, DataType::kFloat32, ReduceOp::kSum, seq,
                                    res, r.stream);
        case Coll::kDirect:
            return directAllReduce(r.view, members, s / 4, DataType::kFloat32, ReduceOp::kSum, seq,
                                   res, r.stream);
        case Coll::kAllGather:
            return allGather(r.view, in, out, s / n, DataType::kUInt8, seq, res, r.stream);
        case Coll::kReduceScatter:
            return reduceScatter(r.view, in, out, s / 4 / n, DataType::kFloat32, ReduceOp::kSum,
                                 seq, res, r.stream);
        case Coll::kAllToAll:
            return allToAll(r.view, in, out, s / n, DataType::kUInt8, seq, res, r.stream);
        case Coll::kBroadcast:
            return broadcast(r.view, in, s, DataType::kUInt8, 0, seq, res, r.stream);
        case Coll::kDirectAllGather:
            return directAllGather(r.view, members, s / n, DataType::kUInt8, seq, res, r.stream);
        case Coll::kDirectReduceScatter:
            return directReduceScatter(r.view, members, s / 4 / n, DataType::kFloat32,
                                       ReduceOp::kSum, seq, res, r.stream);
        case Coll::kDirectAllToAll:
            return directAllToAll(r.view, members, s / n, DataType::kUInt8, seq, res, r.stream);
    }
    return InvalidArgument("unknown collective");
}

// Whether the row's size is a whole number of elements for every rank.
bool applies(Coll c, int n, uint64_t s, uint64_t slot_bytes) {
    switch (c) {
        case Coll::kAllReduce:
        case Coll::kTwoShot:
        case Coll::kDirect:
            return s >= 4;
        case Coll::kOneShot:
            return s >= 4 && s <= slot_bytes;
        case Coll::kReduceScatter:
        case Coll::kDirectReduceScatter:
            return s >= 4ull * n;
        default:
            return s >= static_cast<uint64_t>(n);
    }
}

int copyBandwidth(char* a, char* b, uint64_t bytes, cudaStream_t stream, double* gbps) {
    cudaEvent_t start, stop;
    CUDA_CHILD_OK(cudaEventCreate(&start));
    CUDA_CHILD_OK(cudaEventCreate(&stop));
    CUDA_CHILD_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    constexpr int kReps = 5;
    CUDA_CHILD_OK(cudaEventRecord(start, stream));
    for (int i = 0; i < kReps; ++i)
        CUDA_CHILD_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHILD_OK(cudaEventRecord(stop, stream));
    CUDA_CHILD_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHILD_OK(cudaEventElapsedTime(&ms, start, stop));
    *gbps = 2.0 * bytes * kReps / (ms * 1e-3) / 1e9;
    return 0;
}

struct Target {
    bool checked = false;
    bool met = true;
    double worst = 1e9;
};

int runRank(const Options& o, const std::string& dir, int rank, int n) {
    Rank r;
    if (int rc = test::setUp(r, dir, rank, n, o.slot_bytes); rc != 0)
        return rc;
    r.view.max_blocks = 0;  // the device's co-resident share
    r.view.timeout_ns = 60'000'000'000;
    char *in = nullptr, *out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&in, o.max_bytes));
    CUDA_CHILD_OK(cudaMalloc(&out, o.max_bytes));
    CUDA_CHILD_OK(cudaMemset(in, 0, o.max_bytes));
    CUDA_CHILD_OK(cudaDeviceSynchronize());
    CHILD_OK(test::barrier(*r.store, "allocated", n));
    test::Sharing sharing;
    MemberBuffers members;
    if (int rc = test::shareMemberBuffers(r, sharing, "bench", in, out, o.max_bytes, &members);
        rc != 0)
        return rc;
    double copy_gbps = 0;
    if (rank == 0) {
        if (int rc = copyBandwidth(in, out, o.max_bytes, r.stream, &copy_gbps); rc != 0)
            return rc;
        std::printf("{\"ranks\": %d, \"copy_bytes\": %llu, \"copy_gbps\": %.1f}\n", n,
                    static_cast<unsigned long long>(o.max_bytes), copy_gbps);
    }
    cudaEvent_t start, stop;
    CUDA_CHILD_OK(cudaEventCreate(&start));
    CUDA_CHILD_OK(cudaEventCreate(&stop));
    uint64_t seq = 0;
    int row = 0;
    Target bandwidth, latency;
    const double want_fraction = n == 2 ? 0.6 : 0.5;
    for (Coll c : kColls) {
        for (uint64_t s : kSizes) {
            if (s < o.min_bytes || s > o.max_bytes || !applies(c, n, s, o.slot_bytes))
                continue;
            const int iters =
                o.iters > 0
                    ? o.iters
                    : static_cast<int>(std::clamp<uint64_t>((uint64_t{4} << 30) / s, 5, 200));
            const int warmup = iters >= 50 ? 10 : 2;
            CHILD_OK(test::barrier(*r.store, "row" + std::to_string(row++), n));
            r.clearResult();
            for (int i = 0; i < warmup; ++i)
                CHILD_OK(queueOp(c, r, in, out, members, s, seq++));
            CUDA_CHILD_OK(cudaEventRecord(start, r.stream));
            for (int i = 0; i < iters; ++i)
                CHILD_OK(queueOp(c, r, in, out, members, s, seq++));
            CUDA_CHILD_OK(cudaEventRecord(stop, r.stream));
            CUDA_CHILD_OK(cudaEventSynchronize(stop));
            const DeviceOpResult res = *r.hostResult();
            if (res.status != 0) {
                std::fprintf(stderr, "rank %d %s %llu B: status %d culprit %d\n", rank, collName(c),
                             static_cast<unsigned long long>(s), res.status, res.culprit);
                return 1;
            }
            float ms = 0;
            CUDA_CHILD_OK(cudaEventElapsedTime(&ms, start, stop));
            if (rank != 0)
                continue;
            const double us = ms * 1e3 / iters;
            const double traffic = trafficBytes(c, n, s);
            const double limit_us = traffic / (copy_gbps * 1e9) * 1e6;
            const double fraction = limit_us / us;
            std::printf(
                "{\"ranks\": %d, \"collective\": \"%s\", \"bytes\": %llu, \"iters\": %d, "
                "\"us\": %.2f, \"algbw_gbps\": %.2f, \"traffic_bytes\": %.0f, \"limit_us\": %.2f, "
                "\"fraction\": %.4f}\n",
                n, collName(c), static_cast<unsigned long long>(s), iters, us, s / us / 1e3,
                traffic, limit_us, fraction);
            std::fflush(stdout);
            // At these sizes the backend takes the direct kernels.
            const bool target_coll = c == Coll::kDirect || c == Coll::kDirectAllGather ||
                                     c == Coll::kDirectReduceScatter || c == Coll::kDirectAllToAll;
            if (target_coll && s >= (uint64_t{64} << 20)) {
                bandwidth.checked = true;
                bandwidth.worst = std::min(bandwidth.worst, fraction);
                bandwidth.met = bandwidth.met && fraction >= want_fraction;
            }
            if (c == Coll::kAllReduce && s == 8 && n == 2) {
                latency.checked = true;
                latency.worst = us;
                latency.met = us <= 20.0;
            }
        }
    }
    if (rank == 0) {
        if (bandwidth.checked) {
            std::printf(
                "{\"ranks\": %d, \"target\": \"fraction >= %.2f at >= 64 MiB\", "
                "\"worst\": %.4f, \"met\": %s}\n",
                n, want_fraction, bandwidth.worst, bandwidth.met ? "true" : "false");
        }
        if (latency.checked) {
            std::printf(
                "{\"ranks\": %d, \"target\": \"8 B all_reduce <= 20 us\", \"us\": %.2f, "
                "\"met\": %s}\n",
                n, latency.worst, latency.met ? "true" : "false");
        }
    }
    // The child ends with _exit, which does not flush stdio.
    std::fflush(stdout);
    // The peers' buffers unmapped before their owners exit.
    sharing.peers.clear();
    CHILD_OK(test::barrier(*r.store, "end", n));
    return 0;
}

int runAll(const Options& o) {
    int status = 0;
    for (int n : o.ranks) {
        te::test::TempDir dir;
        std::vector<std::unique_ptr<te::test::Child>> children;
        for (int rank = 0; rank < n; ++rank) {
            children.push_back(std::make_unique<te::test::Child>(
                [&, rank] { return runRank(o, dir.path(), rank, n); }));
        }
        for (int rank = 0; rank < n; ++rank) {
            const int rc = children[rank]->wait(Deadline::afterMs(30 * 60 * 1000));
            if (rc != 0) {
                std::fprintf(stderr, "%d ranks: rank %d exited with %d\n", n, rank, rc);
                status = 1;
            }
        }
    }
    return status;
}

}  // namespace
}  // namespace mooncake::pg::device::bench

int main(int argc, char** argv) {
    using namespace mooncake::pg::device::bench;
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const char* v = argv[i + 1];
        if (flag == "--ranks") {
            o.ranks.clear();
            for (const char* p = v; *p;) {
                o.ranks.push_back(std::atoi(p));
                while (*p && *p != ',')
                    ++p;
                if (*p == ',')
                    ++p;
            }
        } else if (flag == "--min-bytes") {
            o.min_bytes = parseBytes(v);
        } else if (flag == "--max-bytes") {
            o.max_bytes = parseBytes(v);
        } else if (flag == "--slot-bytes") {
            o.slot_bytes = parseBytes(v);
        } else if (flag == "--iters") {
            o.iters = std::atoi(v);
        } else {
            std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
            return 2;
        }
    }
    if (argc % 2 == 0) {
        std::fprintf(stderr, "flag %s has no value\n", argv[argc - 1]);
        return 2;
    }
    return runAll(o);
}
