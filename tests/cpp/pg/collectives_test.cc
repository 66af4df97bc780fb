// Correctness of every collective for world sizes 1..4 against references
// computed in the test. Each world size runs one thread per rank through a
// long list of calls, which is also a lockstep test: any call that left the
// ranks out of step would fail every later one.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "mooncake-pg/core/reduce_kernels.h"
#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

using testutil::Cluster;

// Element counts: empty, single, odd, and large enough that even a
// one-byte dtype spans several 4 KiB slots per block with four ranks.
std::vector<size_t> countsFor(DataType t) {
    return {0, 1, 37, 20480 / dataTypeSize(t) + 3};
}

std::string describe(const char* what, DataType t, ReduceOp op, size_t count) {
    return std::string(what) + " " + dataTypeName(t) + "/" + reduceOpName(op) + " count " +
           std::to_string(count);
}

class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, testutil::Mapping>> {
protected:
    int worldSize() const { return std::get<0>(GetParam()); }
    // A cluster of worldSize() ranks with this test's window mapping.
    std::unique_ptr<Cluster> makeCluster() const {
        return std::make_unique<Cluster>(worldSize(), testutil::smallOptions(),
                                         std::get<1>(GetParam()));
    }
};

TEST_P(CollectivesTest, AllReduceEveryOpAndDtype) {
    const int n = worldSize();
    auto owner = makeCluster();
    Cluster& cluster = *owner;
    const auto members = testutil::allRanks(n);
    cluster.run([&](int r) {
        uint64_t seed = 1;
        for (auto [dtype, op] : testutil::supportedPairs()) {
            for (size_t count : countsFor(dtype)) {
                ++seed;
                const size_t es = dataTypeSize(dtype);
                const bool in_place = seed % 2 == 0;
                std::vector<uint8_t> in(count * es + 1);
                std::vector<uint8_t> out(count * es + 1, 0xCD);
                testutil::fillInput(in.data(), dtype, op, seed, r, 0, count);
                uint8_t* dst = in_place ? in.data() : out.data();
                Status st = cluster.comm(r).allReduce(in.data(), dst, count, dtype, op,
                                                      testutil::generous());
                ASSERT_TRUE(st.ok())
                    << describe("all_reduce", dtype, op, count) << ": " << st.toString();
                const std::string err =
                    testutil::checkReduction(dtype, op, members, seed, 0, dst, count);
                ASSERT_EQ(err, "") << describe("all_reduce", dtype, op, count) << " rank " << r;
            }
        }
    });
}

TEST_P(CollectivesTest, ReduceEveryOpAndDtype) {
    const int n = worldSize();
    auto owner = makeCluster();
    Cluster& cluster = *owner;
    const auto members = testutil::allRanks(n);
    cluster.run([&](int r) {
        uint64_t seed = 1000;
        for (auto [dtype, op] : testutil::supportedPairs()) {
            for (size_t count : countsFor(dtype)) {
                ++seed;
                const int root = static_cast<int>(seed % n);
                const size_t es = dataTypeSize(dtype);
                const bool in_place = seed % 3 == 0;
                std::vector<uint8_t> in(count * es);
                std::vector<uint8_t> out(count * es, 0xCD);
                testutil::fillInput(in.data(), dtype, op, seed, r, 0, count);
                const std::vector<uint8_t> in_copy = in;
                uint8_t* dst = in_place ? in.data() : out.data();
                Status st = cluster.comm(r).reduce(in.data(), dst, count, dtype, op, root,
                                                   testutil::generous());
                ASSERT_TRUE(st.ok())
                    << describe("reduce", dtype, op, count) << ": " << st.toString();
                if (r == root) {
                    const std::string err =
                        testutil::checkReduction(dtype, op, members, seed, 0, dst, count);
                    ASSERT_EQ(err, "") << describe("reduce", dtype, op, count);
                } else {
                    // Non-roots' buffers are never written.
                    ASSERT_EQ(in, in_copy) << describe("reduce", dtype, op, count);
                    if (!in_place) {
                        ASSERT_EQ(out, std::vector<uint8_t>(count * es, 0xCD));
                    }
                }
            }
        }
    });
}

TEST_P(CollectivesTest, ReduceScatterEveryOpAndDtype) {
    const int n = worldSize();
    auto owner = makeCluster();
    Cluster& cluster = *owner;
    const auto members = testutil::allRanks(n);
    cluster.run([&](int r) {
        uint64_t seed = 2000;
        for (auto [dtype, op] : testutil::supportedPairs()) {
            for (size_t total : countsFor(dtype)) {
                ++seed;
                const size_t count = total / n + (total % 2);  // per rank, odd sizes included
                const size_t es = dataTypeSize(dtype);
                std::vector<uint8_t> in(n * count * es);
                std::vector<uint8_t> out(count * es, 0xCD);
                testutil::fillInput(in.data(), dtype, op, seed, r, 0, n * count);
                // In-place variant: out is this rank's block of in.
                const bool in_place = seed % 2 == 0;
                uint8_t* dst = in_place ? in.data() + r * count * es : out.data();
                Status st = cluster.comm(r).reduceScatter(in.data(), dst, count, dtype, op,
                                                          testutil::generous());
                ASSERT_TRUE(st.ok())
                    << describe("reduce_scatter", dtype, op, count) << ": " << st.toString();
                const std::string err =
                    testutil::checkReduction(dtype, op, members, seed, r * count, dst, count);
                ASSERT_EQ(err, "") << describe("reduce_scatter", dtype, op, count) << " rank " << r;
            }
        }
    });
}

const std::vector<size_t> kByteSizes = {0, 1, 37, 5000, 20003};

TEST_P(CollectivesTest, BroadcastGatherScatterAllGather) {
    const int n = worldSize();
    auto owner = makeCluster();
    Cluster& cluster = *owner;
    cluster.run([&](int r) {
        Communicator& comm = cluster.comm(r);
        uint64_t seed = 3000;
        for (size_t bytes : kByteSizes) {
            for (int root = 0; root < n; ++root) {
                ++seed;
                std::vector<uint8_t> buf(bytes, 0xEE);
                if (r == root)
                    testutil::fillPattern(buf.data(), bytes, seed, root);
                Status st = comm.broadcast(buf.data(), bytes, root, testutil::generous());
                ASSERT_TRUE(st.ok()) << st.toString();
                ASSERT_EQ(testutil::firstPatternMismatch(buf.data(), bytes, seed, root), -1)
                    << "broadcast " << bytes << " bytes from " << root;

                ++seed;
                std::vector<uint8_t> mine(bytes);
                testutil::fillPattern(mine.data(), bytes, seed, r);
                std::vector<uint8_t> all(n * bytes, 0xEE);
                st = comm.gather(mine.data(), r == root ? all.data() : nullptr, bytes, root,
                                 testutil::generous());
                ASSERT_TRUE(st.ok()) << st.toString();
                if (r == root) {
                    for (int p = 0; p < n; ++p) {
                        ASSERT_EQ(
                            testutil::firstPatternMismatch(all.data() + p * bytes, bytes, seed, p),
                            -1)
                            << "gather " << bytes << " bytes, block " << p;
                    }
                }

                ++seed;
                std::vector<uint8_t> blocks(r == root ? n * bytes : 0);
                for (int p = 0; p < n && r == root; ++p) {
                    testutil::fillPattern(blocks.data() + p * bytes, bytes, seed, p);
                }
                std::vector<uint8_t> got(bytes, 0xEE);
                st = comm.scatter(r == root ? blocks.data() : nullptr, got.data(), bytes, root,
                                  testutil::generous());
                ASSERT_TRUE(st.ok()) << st.toString();
                ASSERT_EQ(testutil::firstPatternMismatch(got.data(), bytes, seed, r), -1)
                    << "scatter " << bytes << " bytes from " << root;
            }

            // all_gather, separate and in place (in is this rank's block of out).
            for (int in_place = 0; in_place < 2; ++in_place) {
                ++seed;
                std::vector<uint8_t> out(n * bytes, 0xEE);
                std::vector<uint8_t> mine(bytes);
                testutil::fillPattern(mine.data(), bytes, seed, r);
                const uint8_t* in = mine.data();
                if (in_place) {
                    std::copy(mine.begin(), mine.end(), out.begin() + r * bytes);
                    in = out.data() + r * bytes;
                }
                Status st = comm.allGather(in, out.data(), bytes, testutil::generous());
                ASSERT_TRUE(st.ok()) << st.toString();
                for (int p = 0; p < n; ++p) {
                    ASSERT_EQ(
                        testutil::firstPatternMismatch(out.data() + p * bytes, bytes, seed, p), -1)
                        << "all_gather " << bytes << " bytes, block " << p;
                }
            }
        }
    });
}

// Bytes rank s sends to rank r in all-to-all-v case `k`: uneven, often zero,
// sometimes several slots.
size_t pairBytes(int s, int r, int k) {
    const size_t sizes[] = {0, 1, 9, 300, 4096, 4097, 9000};
    return sizes[(s * 5 + r * 3 + k) % 7];
}

TEST_P(CollectivesTest, AllToAllVUneven) {
    const int n = worldSize();
    auto owner = makeCluster();
    Cluster& cluster = *owner;
    cluster.run([&](int r) {
        for (int k = 0; k < 7; ++k) {
            const uint64_t seed = 4000 + k;
            std::vector<size_t> send_bytes(n), send_off(n), recv_bytes(n), recv_off(n);
            size_t send_total = 0;
            size_t recv_total = 0;
            // Blocks in reverse rank order with gaps, so offsets matter.
            for (int p = n - 1; p >= 0; --p) {
                send_bytes[p] = pairBytes(r, p, k);
                send_off[p] = send_total;
                send_total += send_bytes[p] + 3;
                recv_bytes[p] = pairBytes(p, r, k);
                recv_off[p] = recv_total;
                recv_total += recv_bytes[p] + 5;
            }
            std::vector<uint8_t> in(send_total);
            for (int p = 0; p < n; ++p) {
                // What r sends to p: pattern keyed by (sender, receiver).
                testutil::fillPattern(in.data() + send_off[p], send_bytes[p], seed + 100 * p, r);
            }
            std::vector<uint8_t> out(recv_total, 0xEE);
            Status st = cluster.comm(r).allToAllV(in.data(), send_bytes, send_off, out.data(),
                                                  recv_bytes, recv_off, testutil::generous());
            ASSERT_TRUE(st.ok()) << st.toString();
            for (int p = 0; p < n; ++p) {
                ASSERT_EQ(testutil::firstPatternMismatch(out.data() + recv_off[p], recv_bytes[p],
                                                         seed + 100 * r, p),
                          -1)
                    << "all_to_all_v case " << k << " from " << p;
                // The gap after each block is untouched.
                for (size_t g = 0; g < 5; ++g) {
                    ASSERT_EQ(out[recv_off[p] + recv_bytes[p] + g], 0xEE);
                }
            }
        }
    });
}

TEST_P(CollectivesTest, BarrierOrdersEveryone) {
    const int n = worldSize();
    auto owner = makeCluster();
    Cluster& cluster = *owner;
    std::atomic<int> arrived{0};
    cluster.run([&](int r) {
        for (int k = 1; k <= 20; ++k) {
            arrived.fetch_add(1);
            Status st = cluster.comm(r).barrier(testutil::generous());
            ASSERT_TRUE(st.ok()) << st.toString();
            // Nobody leaves barrier k before everyone entered it.
            ASSERT_GE(arrived.load(), k * n);
            st = cluster.comm(r).barrier(testutil::generous());
            ASSERT_TRUE(st.ok()) << st.toString();
        }
    });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(testutil::Mapping::kAll,
                                                              testutil::Mapping::kNone,
                                                              testutil::Mapping::kSome)),
                         [](const auto& info) {
                             return "n" + std::to_string(std::get<0>(info.param)) + "_" +
                                    testutil::mappingName(std::get<1>(info.param));
                         });

// Every rank must end with the same bits, and the one-shot and chunked
// all_reduce must agree bit for bit, because both reduce in rank order.
TEST(CollectivesDeterminism, AllReduceBitsMatchAcrossRanksAndPaths) {
    constexpr int kRanks = 4;
    constexpr size_t kCount = 3001;
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
        std::vector<std::vector<uint8_t>> results;
        // One-shot; chunked with the fused all-gather (mapped windows);
        // chunked with separate all-gather rounds (unmapped windows).
        for (int config = 0; config < 3; ++config) {
            CommOptions options;
            options.chunk_bytes = 4096;
            options.one_shot_max_bytes = config == 0 ? size_t{1} << 20 : 0;
            if (config == 0)
                options.chunk_bytes = 16384;
            Cluster cluster(kRanks, options,
                            config == 2 ? testutil::Mapping::kNone : testutil::Mapping::kAll);
            const size_t es = dataTypeSize(dtype);
            std::vector<std::vector<uint8_t>> outs(kRanks, std::vector<uint8_t>(kCount * es));
            cluster.run([&](int r) {
                // Arbitrary floats, so rounding depends on the order of the sum.
                std::vector<float> values(kCount);
                for (size_t i = 0; i < kCount; ++i) {
                    values[i] = static_cast<float>(testutil::rnd(7, r, i) % 100000) / 977.0f;
                }
                std::vector<uint8_t> in(kCount * es);
                for (size_t i = 0; i < kCount; ++i) {
                    if (dtype == DataType::kFloat32) {
                        std::memcpy(in.data() + 4 * i, &values[i], 4);
                    } else {
                        const uint16_t h = dtype == DataType::kFloat16 ? floatToHalf(values[i])
                                                                       : floatToBfloat16(values[i]);
                        std::memcpy(in.data() + 2 * i, &h, 2);
                    }
                }
                Status st = cluster.comm(r).allReduce(in.data(), outs[r].data(), kCount, dtype,
                                                      ReduceOp::kSum, testutil::generous());
                ASSERT_TRUE(st.ok()) << st.toString();
            });
            for (int r = 1; r < kRanks; ++r)
                EXPECT_EQ(outs[r], outs[0]) << "rank " << r;
            results.push_back(outs[0]);
        }
        EXPECT_EQ(results[0], results[1]) << dataTypeName(dtype);
        EXPECT_EQ(results[0], results[2]) << dataTypeName(dtype);
    }
}

// A message much larger than the slots goes through with bounded window
// memory: many rounds, every slot reused many times.
TEST(CollectivesLarge, AllReduceManyRounds) {
    CommOptions options;
    options.chunk_bytes = 64 << 10;
    Cluster cluster(2, options);
    constexpr size_t kCount = 1 << 20;  // 4 MiB of float32
    cluster.run([&](int r) {
        std::vector<float> data(kCount);
        for (size_t i = 0; i < kCount; ++i)
            data[i] = static_cast<float>((i % 1000) + r);
        Status st = cluster.comm(r).allReduce(data.data(), data.data(), kCount, DataType::kFloat32,
                                              ReduceOp::kSum, testutil::generous());
        ASSERT_TRUE(st.ok()) << st.toString();
        for (size_t i = 0; i < kCount; ++i) {
            ASSERT_EQ(data[i], static_cast<float>(2 * (i % 1000) + 1)) << i;
        }
    });
}

}  // namespace
}  // namespace mooncake::pg
