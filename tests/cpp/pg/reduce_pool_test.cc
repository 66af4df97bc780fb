// The multi-threaded element-wise steps of large reductions (core/
// reduce_pool.h): every part runs exactly once, and a reduction split over
// 1..N threads gives exactly the reference result and the same bits as one
// thread, for every dtype and op, odd sizes and in place; then all_reduce
// through a Communicator with reduce_threads 1..N.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/reduce_kernels.h"
#include "mooncake-pg/core/reduce_pool.h"
#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

constexpr int kMaxThreads = 6;

std::string describe(DataType t, ReduceOp op, int threads, size_t count) {
    return std::string(dataTypeName(t)) + "/" + reduceOpName(op) + " threads " +
           std::to_string(threads) + " count " + std::to_string(count);
}

// Enough elements that the parallel path splits them (kParallelMinBytes),
// plus an odd tail so the last slice is not a whole grain.
size_t largeCount(DataType t, int inputs) {
    const size_t unit = dataTypeSize(t) * static_cast<size_t>(inputs + 1);
    return kParallelMinBytes / unit * 3 + 17;
}

TEST(ReducePool, EveryPartRunsExactlyOnce) {
    ReducePool pool;
    for (int threads = 1; threads <= kMaxThreads + 2; ++threads) {
        for (size_t parts :
             {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{33}, size_t{1000}}) {
            std::vector<std::atomic<int>> hits(parts);
            pool.run(threads, parts, [&](size_t p) { hits[p].fetch_add(1); });
            for (size_t p = 0; p < parts; ++p) {
                ASSERT_EQ(hits[p].load(), 1)
                    << "part " << p << " of " << parts << ", threads " << threads;
            }
        }
    }
}

TEST(ReducePool, RangesCoverEverythingOnce) {
    ReducePool pool(kMaxThreads);
    for (int threads = 1; threads <= kMaxThreads; ++threads) {
        for (size_t total :
             {size_t{1}, size_t{63}, size_t{64}, size_t{1} << 20, (size_t{3} << 20) + 5}) {
            std::vector<uint8_t> seen(total, 0);
            std::atomic<bool> misaligned{false};
            parallelRanges(&pool, threads, total, 64, 1, [&](size_t b, size_t e) {
                if (b % 64 != 0)
                    misaligned = true;
                for (size_t i = b; i < e; ++i)
                    ++seen[i];
            });
            EXPECT_FALSE(misaligned.load()) << "threads " << threads << " total " << total;
            for (size_t i = 0; i < total; ++i)
                ASSERT_EQ(seen[i], 1) << "unit " << i << " of " << total << ", threads " << threads;
        }
    }
}

// Every dtype and op, 1..N threads, several input counts and sizes: the
// result equals the reference (computed in double / wide integers, never by
// the kernels) and the single-thread kernel's bits.
TEST(ParallelReduce, MatchesReferenceAndSerialBits) {
    ReducePool pool(kMaxThreads);
    uint64_t seed = 100;
    for (auto [dtype, op] : testutil::supportedPairs()) {
        for (int n : {2, 3}) {
            for (size_t count : {size_t{1}, size_t{511}, largeCount(dtype, n)}) {
                ++seed;
                const size_t es = dataTypeSize(dtype);
                std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n));
                std::vector<const void*> ptrs;
                for (int k = 0; k < n; ++k) {
                    in[k].resize(count * es);
                    testutil::fillInput(in[k].data(), dtype, op, seed, k, 0, count);
                    ptrs.push_back(in[k].data());
                }
                std::vector<uint8_t> serial(count * es);
                reduceInto(dtype, op, serial.data(), ptrs.data(), n, count);
                const std::string err = testutil::checkReduction(dtype, op, testutil::allRanks(n),
                                                                 seed, 0, serial.data(), count);
                ASSERT_EQ(err, "") << describe(dtype, op, 1, count);
                for (int threads = 1; threads <= kMaxThreads; ++threads) {
                    std::vector<uint8_t> out(count * es + 1, 0xCD);
                    parallelReduceInto(&pool, threads, dtype, op, out.data(), ptrs.data(), n,
                                       count);
                    ASSERT_EQ(std::memcmp(out.data(), serial.data(), count * es), 0)
                        << describe(dtype, op, threads, count);
                    ASSERT_EQ(out[count * es], 0xCD)
                        << "wrote past the end: " << describe(dtype, op, threads, count);
                }
            }
        }
    }
}

// Output aliasing its first input, one input, and many inputs.
TEST(ParallelReduce, InPlaceAndInputCounts) {
    ReducePool pool(kMaxThreads);
    const DataType dtype = DataType::kInt32;
    const ReduceOp op = ReduceOp::kSum;
    uint64_t seed = 7000;
    for (int n : {1, 2, 5, 9}) {
        for (int threads = 1; threads <= kMaxThreads; ++threads) {
            ++seed;
            const size_t count = largeCount(dtype, n);
            std::vector<std::vector<uint8_t>> in(static_cast<size_t>(n));
            std::vector<const void*> ptrs;
            for (int k = 0; k < n; ++k) {
                in[k].resize(count * 4);
                testutil::fillInput(in[k].data(), dtype, op, seed, k, 0, count);
                ptrs.push_back(in[k].data());
            }
            parallelReduceInto(&pool, threads, dtype, op, in[0].data(), ptrs.data(), n, count);
            ASSERT_EQ(testutil::checkReduction(dtype, op, testutil::allRanks(n), seed, 0,
                                               in[0].data(), count),
                      "")
                << "in place, " << n << " inputs, threads " << threads;
        }
    }
}

// Two threads sharing one pool at once: one gets the helpers, the other runs
// alone; both get their exact results.
TEST(ParallelReduce, ConcurrentCallersShareOnePool) {
    ReducePool pool(kMaxThreads);
    const DataType dtype = DataType::kFloat32;
    const ReduceOp op = ReduceOp::kSum;
    const size_t count = largeCount(dtype, 2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> callers;
    for (int c = 0; c < 2; ++c) {
        callers.emplace_back([&, c] {
            for (int iter = 0; iter < 20 && errors[c].empty(); ++iter) {
                const uint64_t seed = 9000 + static_cast<uint64_t>(c * 100 + iter);
                std::vector<uint8_t> a(count * 4), b(count * 4), out(count * 4);
                testutil::fillInput(a.data(), dtype, op, seed, 0, 0, count);
                testutil::fillInput(b.data(), dtype, op, seed, 1, 0, count);
                const void* ptrs[2] = {a.data(), b.data()};
                parallelReduceInto(&pool, kMaxThreads, dtype, op, out.data(), ptrs, 2, count);
                errors[c] = testutil::checkReduction(dtype, op, testutil::allRanks(2), seed, 0,
                                                     out.data(), count);
            }
        });
    }
    for (auto& t : callers)
        t.join();
    EXPECT_EQ(errors[0], "");
    EXPECT_EQ(errors[1], "");
}

TEST(ReduceThreads, ConfiguredCountWinsAndStaysInBounds) {
    EXPECT_EQ(reduceThreadsFor(1, 1), 1);
    EXPECT_EQ(reduceThreadsFor(3, 100), 3);
    EXPECT_EQ(reduceThreadsFor(100000, 1), ReducePool::kMaxThreads);
    if (std::getenv("MC_PG_REDUCE_THREADS") != nullptr) {
        std::printf("MC_PG_REDUCE_THREADS is set: skipping the checks of the default\n");
        GTEST_SKIP() << "MC_PG_REDUCE_THREADS is set; the default policy is not in effect";
    }
    EXPECT_GE(reduceThreadsFor(0, 1), 1);
    EXPECT_LE(reduceThreadsFor(0, 1), 8);
    // More ranks than cores never means fewer than one thread.
    EXPECT_EQ(reduceThreadsFor(0, 100000), 1);
}

// all_reduce through the Communicator with reduce_threads 1..N: slots large
// enough that each round's piece takes the parallel path, on the fused
// (every window mapped) and the copying (nothing mapped) paths.
class ParallelAllReduce : public ::testing::TestWithParam<std::tuple<int, testutil::Mapping>> {};

TEST_P(ParallelAllReduce, ExactForEveryThreadCount) {
    const int n = std::get<0>(GetParam());
    const int max_threads = 4;
    for (int threads = 1; threads <= max_threads; ++threads) {
        CommOptions options;
        // Pieces of 256 KiB: several rounds per block, each parallel.
        options.chunk_bytes = size_t{256} << 10;
        options.reduce_threads = threads;
        testutil::Cluster cluster(n, options, std::get<1>(GetParam()));
        const auto members = testutil::allRanks(n);
        // Every pair with one thread count in turn, float32 SUM with all.
        const auto pairs = testutil::supportedPairs();
        cluster.run([&](int r) {
            uint64_t seed = 500 + static_cast<uint64_t>(threads) * 1000;
            for (size_t i = 0; i < pairs.size(); ++i) {
                const auto [dtype, op] = pairs[i];
                const bool all_threads = dtype == DataType::kFloat32 && op == ReduceOp::kSum;
                if (!all_threads && static_cast<int>(i % max_threads) != threads - 1)
                    continue;
                ++seed;
                const size_t es = dataTypeSize(dtype);
                // Blocks of several pieces, with odd lengths.
                const size_t count = (size_t{1} << 20) / es + 2 * static_cast<size_t>(n) + 1;
                std::vector<uint8_t> in(count * es);
                testutil::fillInput(in.data(), dtype, op, seed, r, 0, count);
                Status st = cluster.comm(r).allReduce(in.data(), in.data(), count, dtype, op,
                                                      testutil::generous());
                ASSERT_TRUE(st.ok())
                    << describe(dtype, op, threads, count) << ": " << st.toString();
                ASSERT_EQ(testutil::checkReduction(dtype, op, members, seed, 0, in.data(), count),
                          "")
                    << describe(dtype, op, threads, count) << " rank " << r;
            }
        });
    }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ParallelAllReduce,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(testutil::Mapping::kAll,
                                                              testutil::Mapping::kNone)),
                         [](const auto& info) {
                             return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                    testutil::mappingName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace mooncake::pg
