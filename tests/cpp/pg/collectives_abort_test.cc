// Abort notices (core/collectives/rounds.h): who fails a call, and who must
// not. A member that leaves right after finishing its part fails nobody; a
// member dropped from the membership while inside a call is told at once.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

// Holds back this rank's flag writes to one peer until open(): the peer then
// keeps waiting on this rank while everything else proceeds. Data puts pass
// (they are invisible until the flag that follows them).
class GatedFabric : public testutil::ForwardingFabric {
public:
    GatedFabric(std::shared_ptr<Fabric> inner, int gated_peer)
        : ForwardingFabric(std::move(inner)), gated_peer_(gated_peer) {}
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (peer == gated_peer_ && !open_) {
            held_.emplace_back(offset, value);
            return Status::OK();
        }
        return inner().putFlag(peer, offset, value, deadline);
    }

    // Applies the held flags in order and lets later ones through.
    void open() {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [offset, value] : held_)
            ASSERT_TRUE(inner().putFlag(gated_peer_, offset, value, Deadline::never()).ok());
        held_.clear();
        open_ = true;
    }

private:
    int gated_peer_;
    std::mutex mu_;
    bool open_ = false;
    std::vector<std::pair<uint64_t, uint64_t>> held_;
};

// Counts how often its rank's waits check on peers: waitFlag asks
// peerFailed once per 64 looks at the awaited flag (and the abort lines).
class CountingFabric : public testutil::ForwardingFabric {
public:
    using ForwardingFabric::ForwardingFabric;
    bool peerFailed(int peer) const override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            ++checks_;
        }
        cv_.notify_all();
        return ForwardingFabric::peerFailed(peer);
    }
    uint64_t checks() const {
        std::lock_guard<std::mutex> lock(mu_);
        return checks_;
    }
    // Whether `more` further checks happened before `deadline`.
    bool awaitChecks(uint64_t from, uint64_t more, Deadline deadline) const {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_until(lock, deadline.at(), [&] { return checks_ >= from + more; });
    }

private:
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    mutable uint64_t checks_ = 0;
};

// Four ranks run one small all_reduce (rank r contributes r + 1) while
// `gated_rank`'s flags to `gated_peer` are held back. Once `actor` has
// finished its own call it runs `then`, waits until `gated_peer` has gone
// round its wait loop many times since (so it has looked at every abort line
// and member after the event), and opens the gate. Every rank must still get
// the full sum, with nobody blamed.
void expectHeldBackAllReduceCompletes(
    int gated_rank, int gated_peer, int actor,
    const std::function<void(ThreadFabricGroup&, Communicator&)>& then) {
    const CommOptions options = testutil::smallOptions();
    ThreadFabricGroup group(4, Communicator::windowBytesFor(4, options));
    auto gated = std::make_shared<GatedFabric>(group.fabric(gated_rank), gated_peer);
    auto watched = std::make_shared<CountingFabric>(group.fabric(gated_peer));
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < 4; ++r) {
        std::shared_ptr<Fabric> fabric = r == gated_rank   ? gated
                                         : r == gated_peer ? watched
                                                           : group.fabric(r);
        comms.push_back(std::make_unique<Communicator>(fabric, options));
    }
    std::vector<Status> results(4);
    std::vector<std::vector<int32_t>> values(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
        threads.emplace_back([&, r] {
            values[r].assign(8, r + 1);
            results[r] = comms[r]->allReduce(values[r].data(), values[r].data(), values[r].size(),
                                             DataType::kInt32, ReduceOp::kSum,
                                             Deadline::after(std::chrono::seconds(20)));
            if (r != actor)
                return;
            then(group, *comms[r]);
            // 100 checks are 6400 looks at the flags after the event.
            EXPECT_TRUE(watched->awaitChecks(watched->checks(), 100,
                                             Deadline::after(std::chrono::seconds(20))))
                << "rank " << gated_peer << " stopped waiting: " << watched->checks();
            gated->open();
        });
    }
    for (auto& t : threads)
        t.join();
    for (int r = 0; r < 4; ++r) {
        ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].toString();
        EXPECT_EQ(values[r], std::vector<int32_t>(8, 10)) << "rank " << r;
        EXPECT_TRUE(comms[r]->lastFailure().failed_ranks.empty()) << "rank " << r;
    }
}

// Rank 3 finishes a one-round all_reduce and dies while rank 0 still waits
// for rank 1's message (held back). Nobody needs anything more from rank 3,
// so every survivor's call must succeed with the full sum.
TEST(CollectivesAbort, MemberLeavingRightAfterItsPartFailsNobody) {
    expectHeldBackAllReduceCompletes(
        /*gated_rank=*/1, /*gated_peer=*/0, /*actor=*/3,
        [](ThreadFabricGroup& group, Communicator&) { group.kill(3); });
}

// Ranks 0 and 1 drop rank 2 while rank 2 sits in a barrier they will never
// enter: rank 2 fails at once instead of at its deadline, and all three work
// together again in a later epoch (the old notice is then stale).
TEST(CollectivesAbort, DroppedMemberInsideACallIsToldAtOnce) {
    testutil::Cluster cluster(3);
    Status dropped;
    cluster.run([&](int r) {
        if (r == 2) {
            // kAborted naming the deactivation (not kTimeout) says it was
            // told, not left to run into its deadline.
            dropped = cluster.comm(r).barrier(Deadline::after(std::chrono::seconds(20)));
            return;
        }
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, 1).ok());
        std::vector<int32_t> v(4, r + 1);
        Status st = cluster.comm(r).allReduce(v.data(), v.data(), v.size(), DataType::kInt32,
                                              ReduceOp::kSum, testutil::generous());
        ASSERT_TRUE(st.ok()) << st.toString();
        EXPECT_EQ(v, std::vector<int32_t>(4, 3));
    });
    EXPECT_EQ(dropped.code(), StatusCode::kAborted) << dropped.toString();
    EXPECT_NE(dropped.toString().find("rank 2 was deactivated in epoch 1"), std::string::npos)
        << dropped.toString();
    EXPECT_TRUE(cluster.comm(2).lastFailure().failed_ranks.empty());

    cluster.run([&](int r) {
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, 2).ok());
        std::vector<int32_t> v(4, r + 1);
        Status st = cluster.comm(r).allReduce(v.data(), v.data(), v.size(), DataType::kInt32,
                                              ReduceOp::kSum, testutil::generous());
        ASSERT_TRUE(st.ok()) << "rank " << r << ": " << st.toString();
        EXPECT_EQ(v, std::vector<int32_t>(4, 6));
    });
}

// Rank 1 is still finishing a call the others completed (rank 3's message to
// it is held back) when rank 0 drops it and writes it a removed notice. The
// notice comes from rank 0, which delivered everything before moving on, so
// rank 1's wait on rank 3 goes on and the call completes there too.
TEST(CollectivesAbort, RemovedNoticeDoesNotAbortACallTheOthersCompleted) {
    expectHeldBackAllReduceCompletes(
        /*gated_rank=*/3, /*gated_peer=*/1, /*actor=*/0, [](ThreadFabricGroup&, Communicator& c) {
            ASSERT_TRUE(c.setMembership({1, 0, 1, 1}, 1).ok());
        });
}

// Tells when its rank has written its first flag to `peer`.
class FirstFlagFabric : public testutil::ForwardingFabric {
public:
    FirstFlagFabric(std::shared_ptr<Fabric> inner, int peer)
        : ForwardingFabric(std::move(inner)), peer_(peer) {}
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override {
        Status st = inner().putFlag(peer, offset, value, deadline);
        if (peer == peer_) {
            std::lock_guard<std::mutex> lock(mu_);
            sent_ = true;
            cv_.notify_all();
        }
        return st;
    }
    bool awaitSent(Deadline deadline) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_until(lock, deadline.at(), [&] { return sent_; });
    }

private:
    int peer_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool sent_ = false;
};

// A survivor blocked on another survivor (not on the dead rank) learns the
// culprit from the notice: the status names both the reporter and rank 3.
// Rank 0 enters only once rank 1's first message to it is written, so when
// its short deadline passes the only member it misses is rank 2, however
// late the threads run on a loaded machine.
TEST(CollectivesAbort, NoticeCarriesTheCulpritAndTheCode) {
    const CommOptions options = testutil::smallOptions();
    ThreadFabricGroup group(3, Communicator::windowBytesFor(3, options));
    auto rank1 = std::make_shared<FirstFlagFabric>(group.fabric(1), 0);
    Communicator comm0(group.fabric(0), options);
    Communicator comm1(rank1, options);
    std::vector<Status> results(2);
    auto call = [&](Communicator& c, std::chrono::milliseconds timeout) {
        std::vector<float> v(20000, 1.0f);
        return c.allReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum,
                           Deadline::after(timeout));
    };
    std::thread t1([&] { results[1] = call(comm1, std::chrono::milliseconds(20000)); });
    if (rank1->awaitSent(Deadline::after(std::chrono::seconds(20))))
        results[0] = call(comm0, std::chrono::milliseconds(200));
    else
        ADD_FAILURE() << "rank 1 never wrote to rank 0";
    t1.join();
    // Rank 0 timed out on rank 2 (never entered); rank 1, with a 20 s
    // deadline, fails with rank 0's verdict (not its own timeout).
    std::vector<Communicator*> comms = {&comm0, &comm1};
    for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(results[r].code(), StatusCode::kTimeout) << results[r].toString();
        EXPECT_EQ(comms[r]->lastFailure().failed_ranks, std::vector<int>{2})
            << "rank " << r << ": " << results[r].toString();
    }
    EXPECT_NE(results[1].toString().find("rank 0 failed the call because of rank 2"),
              std::string::npos)
        << results[1].toString();
}

}  // namespace
}  // namespace mooncake::pg
