// A call that one rank fails before the exchange (its own argument checks)
// while the others made a valid call: every rank must fail that call with one
// error, and the next call must line up and produce exact values.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

using testutil::Cluster;

void expectWorkingAllReduce(Cluster& cluster, int r) {
    std::vector<int32_t> v(3, r + 1);
    Status st = cluster.comm(r).allReduce(v.data(), v.data(), v.size(), DataType::kInt32,
                                          ReduceOp::kSum, testutil::generous());
    ASSERT_TRUE(st.ok()) << st.toString();
    const int n = cluster.size();
    EXPECT_EQ(v, std::vector<int32_t>(3, n * (n + 1) / 2));
}

// All ranks got `code` and the very same message, which contains `part`.
void expectOneError(const std::vector<Status>& results, StatusCode code, const std::string& part) {
    for (size_t r = 0; r < results.size(); ++r) {
        EXPECT_EQ(results[r].code(), code) << "rank " << r << ": " << results[r].toString();
        EXPECT_EQ(results[r].message(), results[0].message()) << "rank " << r;
        EXPECT_NE(results[r].message().find(part), std::string::npos) << results[r].message();
    }
}

// The torch call of issue 8: all_to_all_single with output_split_sizes
// [2, 2] everywhere and input_split_sizes [1, 3] on rank 0 only (int32).
TEST(CollectivesLocalFailure, AllToAllVOwnPieceMismatchFailsEveryRankThenWorks) {
    Cluster cluster(2);
    std::vector<Status> results(2);
    cluster.run([&](int r) {
        const size_t e = sizeof(int32_t);
        std::vector<int32_t> in(4, 7), out(4, -1);
        std::vector<size_t> send =
            r == 0 ? std::vector<size_t>{1 * e, 3 * e} : std::vector<size_t>{2 * e, 2 * e};
        std::vector<size_t> send_off = {0, send[0]};
        std::vector<size_t> recv = {2 * e, 2 * e}, recv_off = {0, 2 * e};
        results[r] = cluster.comm(r).allToAllV(in.data(), send, send_off, out.data(), recv,
                                               recv_off, testutil::generous());
        EXPECT_EQ(out, std::vector<int32_t>(4, -1)) << "rank " << r << ": the failed call wrote";

        // A correct all_to_all_v right after: rank p sends 10 * p + q to q.
        for (int q = 0; q < 2; ++q) {
            in[2 * q] = in[2 * q + 1] = 10 * r + q;
        }
        send = {2 * e, 2 * e};
        send_off = {0, 2 * e};
        Status st = cluster.comm(r).allToAllV(in.data(), send, send_off, out.data(), recv, recv_off,
                                              testutil::generous());
        ASSERT_TRUE(st.ok()) << st.toString();
        EXPECT_EQ(out, (std::vector<int32_t>{r, r, 10 + r, 10 + r}));
        expectWorkingAllReduce(cluster, r);
    });
    expectOneError(results, StatusCode::kInvalidArgument,
                   "all_to_all_v: rank 0 passed send_bytes[0]=4 but recv_bytes[0]=8");
    EXPECT_NE(results[1].message().find("rank 0 failed the call before the exchange"),
              std::string::npos)
        << results[1].message();
}

// One bad call per local check of every collective; `bad` decides whether
// this rank passes the bad argument. Buffers are 4 int32 per rank block.
struct LocalCase {
    const char* name;
    const char* error;  // part of the expected message
    std::function<Status(Communicator&, int rank, bool bad, std::vector<int32_t>& out)> call;
};

std::vector<LocalCase> localCases() {
    const Deadline dl = testutil::generous();
    static std::vector<int32_t> in(64, 1);
    return {
        {"all_reduce dtype/op", "avg",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.allReduce(in.data(), out.data(), 4, DataType::kInt32,
                                bad ? ReduceOp::kAvg : ReduceOp::kSum, dl);
         }},
        {"all_reduce null out", "out is null",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.allReduce(in.data(), bad ? nullptr : out.data(), 4, DataType::kInt32,
                                ReduceOp::kSum, dl);
         }},
        {"all_reduce overflow", "overflows",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.allReduce(in.data(), out.data(), bad ? ~size_t{0} : 4, DataType::kInt32,
                                ReduceOp::kSum, dl);
         }},
        {"broadcast root", "root 9 is not an active rank",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.broadcast(out.data(), 16, bad ? 9 : 0, dl);
         }},
        {"reduce op", "bxor",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.reduce(in.data(), out.data(), 4, DataType::kFloat32,
                             bad ? ReduceOp::kBxor : ReduceOp::kSum, 0, dl);
         }},
        {"all_gather null in", "in is null",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.allGather(bad ? nullptr : in.data(), out.data(), 16, dl);
         }},
        {"reduce_scatter null out", "out is null",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.reduceScatter(in.data(), bad ? nullptr : out.data(), 4, DataType::kInt32,
                                    ReduceOp::kSum, dl);
         }},
        {"all_to_all_v vector sizes", "need 3 entries each",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             std::vector<size_t> b(bad ? 2 : 3, 16), off = {0, 16, 32};
             return c.allToAllV(in.data(), b, off, out.data(), std::vector<size_t>(3, 16), off, dl);
         }},
        {"all_to_all_v in == out", "must not be the same buffer",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             std::vector<size_t> b(3, 16), off = {0, 16, 32};
             return c.allToAllV(bad ? out.data() : in.data(), b, off, out.data(), b, off, dl);
         }},
        {"gather root", "root -1 is not an active rank",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.gather(in.data(), out.data(), 16, bad ? -1 : 0, dl);
         }},
        {"scatter null out", "out is null",
         [dl](Communicator& c, int, bool bad, std::vector<int32_t>& out) {
             return c.scatter(in.data(), bad ? nullptr : out.data(), 16, 0, dl);
         }},
    };
}

TEST(CollectivesLocalFailure, EveryLocalCheckFailsEveryRankAndKeepsStep) {
    Cluster cluster(3);
    for (const LocalCase& c : localCases()) {
        for (int culprit = 0; culprit < 3; ++culprit) {
            SCOPED_TRACE(std::string(c.name) + ", bad on rank " + std::to_string(culprit));
            std::vector<Status> results(3);
            cluster.run([&](int r) {
                std::vector<int32_t> out(64, -1);
                results[r] = c.call(cluster.comm(r), r, r == culprit, out);
                EXPECT_EQ(out, std::vector<int32_t>(64, -1)) << "rank " << r << " was written";
                expectWorkingAllReduce(cluster, r);
            });
            expectOneError(results, StatusCode::kInvalidArgument, c.error);
            expectOneError(results, StatusCode::kInvalidArgument,
                           "rank " + std::to_string(culprit) + " failed the call");
        }
    }
}

TEST(CollectivesLocalFailure, SeveralRanksFailLocallyTheLowestIsReported) {
    Cluster cluster(4);
    std::vector<Status> results(4);
    cluster.run([&](int r) {
        std::vector<float> buf(4, 1.0f);
        // Ranks 1 and 3 fail differently, rank 0 and 2 are fine.
        const int root = r == 1 ? 7 : r == 3 ? -2 : 0;
        results[r] = cluster.comm(r).broadcast(buf.data(), 16, root, testutil::generous());
        expectWorkingAllReduce(cluster, r);
    });
    expectOneError(results, StatusCode::kInvalidArgument,
                   "broadcast: root 7 is not an active rank");
}

TEST(CollectivesLocalFailure, EveryRankFailingLocallyStillKeepsStep) {
    Cluster cluster(3);
    std::vector<Status> results(3);
    cluster.run([&](int r) {
        std::vector<int32_t> v(4, 1);
        results[r] = cluster.comm(r).allReduce(v.data(), v.data(), 4, DataType::kInt32,
                                               ReduceOp::kAvg, testutil::generous());
        expectWorkingAllReduce(cluster, r);
    });
    expectOneError(results, StatusCode::kInvalidArgument, "rank 0 failed the call");
}

// A call signature set before a call that fails in begin() belongs to that
// call; it must not tag the next one.
TEST(CollectivesLocalFailure, SignatureOfACallFailedInBeginIsDropped) {
    Cluster cluster(2);
    cluster.run([&](int r) {
        ASSERT_TRUE(cluster.comm(r).setMembership({0, 1}, 1).ok());
        if (r == 0) {
            cluster.comm(0).setNextCallSignature(0xbeef);
            EXPECT_EQ(cluster.comm(0).barrier(testutil::generous()).code(),
                      StatusCode::kInvalidArgument);  // rank 0 is not active
        }
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1}, 2).ok());
        expectWorkingAllReduce(cluster, r);
    });
}

}  // namespace
}  // namespace mooncake::pg
