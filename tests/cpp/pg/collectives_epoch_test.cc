// Membership epochs: they grow past the 16 epoch bits that tokens carry, a
// rank may skip epochs, a rank still in an older epoch learns of a newer
// one through a status code of its own, and a dropped rank still reading a
// peer's published data in place never takes the next epoch's for it.
#include <condition_variable>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

using testutil::Cluster;

// all_reduce over `members` (exact int sums) and a multi-round all_gather
// (byte patterns) on rank r.
void expectWorkingCalls(Cluster& cluster, int r, const std::vector<int>& members, uint64_t salt) {
    std::vector<int64_t> v(5, static_cast<int64_t>(salt) * 10 + r);
    Status st = cluster.comm(r).allReduce(v.data(), v.data(), v.size(), DataType::kInt64,
                                          ReduceOp::kSum, testutil::generous());
    ASSERT_TRUE(st.ok()) << "epoch salt " << salt << ": " << st.toString();
    int64_t want = 0;
    for (int m : members)
        want += static_cast<int64_t>(salt) * 10 + m;
    EXPECT_EQ(v, std::vector<int64_t>(5, want));

    const size_t block = 3 * testutil::smallOptions().chunk_bytes + 17;
    std::vector<uint8_t> in(block), out(block * cluster.size(), 0);
    testutil::fillPattern(in.data(), block, salt, r);
    st = cluster.comm(r).allGather(in.data(), out.data(), block, testutil::generous());
    ASSERT_TRUE(st.ok()) << "epoch salt " << salt << ": " << st.toString();
    for (int m : members) {
        EXPECT_EQ(testutil::firstPatternMismatch(out.data() + m * block, block, salt, m), -1)
            << "rank " << r << " salt " << salt << ": block of rank " << m;
    }
}

TEST(CollectivesEpoch, EpochsPastTheTokenBitsKeepWorking) {
    Cluster cluster(3);
    // Steps below 49152 epochs (Communicator::setMembership).
    const std::vector<uint64_t> epochs = {1,      30000,  65534,  65535,  65536, 65537,
                                          100000, 131071, 131072, 131073, 180000};
    cluster.run([&](int r) {
        for (uint64_t e : epochs) {
            ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, e).ok()) << "epoch " << e;
            expectWorkingCalls(cluster, r, {0, 1, 2}, e);
            expectWorkingCalls(cluster, r, {0, 1, 2}, e + 1);
        }
    });
}

// Rank 2 is left out while the others go through 60000 epochs (in steps, as
// views come), applying only some of them itself: flags it wrote into their
// windows in epoch 1 would read as newer than epoch 60002 (modulo 2^16) had
// they not been cleared, and so would theirs in its window.
TEST(CollectivesEpoch, RankBackAfterManyEpochsIgnoresItsOldFlags) {
    Cluster cluster(3);
    // Views are applied after they exist and before the next-but-one does:
    // rank 2 applies 20002 and 40002 once the others worked in 40002, and
    // 60002 comes after that.
    std::latch others_in_40002(2);
    std::latch rank2_in_40002(1);
    // Every rank has its epoch-1 results before the others move on: this test
    // is about old flags after many epochs, not about a peer still copying
    // out a call's last round while the others already run the next epoch
    // (DroppedRankReadingInPlaceNeverTakesTheNextEpochsData is).
    std::latch epoch1_done(3);
    cluster.run([&](int r) {
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, 1).ok());
        expectWorkingCalls(cluster, r, {0, 1, 2}, 1);
        epoch1_done.arrive_and_wait();
        if (r != 2) {
            for (uint64_t e : {2, 20002, 40002}) {
                ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, e).ok());
                expectWorkingCalls(cluster, r, {0, 1}, e);
            }
            others_in_40002.count_down();
            rank2_in_40002.wait();
        } else {
            others_in_40002.wait();
            ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, 20002).ok());
            ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 0}, 40002).ok());
            rank2_in_40002.count_down();
        }
        ASSERT_TRUE(cluster.comm(r).setMembership({1, 1, 1}, 60002).ok());
        expectWorkingCalls(cluster, r, {0, 1, 2}, 3);
        expectWorkingCalls(cluster, r, {0, 1, 2}, 4);
    });
}

// Rank 1 applies epoch 1 and calls; rank 0, still in epoch 0, must learn
// that by kEpochChanged (not by the text of a message), apply epoch 1 and
// retry; both calls then complete.
TEST(CollectivesEpoch, PeerInANewerEpochIsReportedByItsOwnCode) {
    Cluster cluster(2);
    cluster.run([&](int r) {
        expectWorkingCalls(cluster, r, {0, 1}, 7);
        if (r == 1) {
            ASSERT_TRUE(cluster.comm(1).setMembership({1, 1}, 1).ok());
            expectWorkingCalls(cluster, 1, {0, 1}, 8);
            return;
        }
        std::vector<int64_t> v(5, 80);
        Status st = cluster.comm(0).allReduce(v.data(), v.data(), v.size(), DataType::kInt64,
                                              ReduceOp::kSum, testutil::generous());
        EXPECT_EQ(st.code(), StatusCode::kEpochChanged) << st.toString();
        ASSERT_TRUE(cluster.comm(0).setMembership({1, 1}, 1).ok());
        expectWorkingCalls(cluster, 0, {0, 1}, 8);
    });
}

// Holds its rank at the in-place read of `source`'s window in the armed
// call: once the rank has written its data flag to every other rank (its
// round messages are out, so the others can finish the round without it),
// its next peerWindow(source) is the lookup receiveAll makes just before the
// payload is copied out of that window. It waits there until release().
class HeldReaderFabric : public testutil::ForwardingFabric {
public:
    HeldReaderFabric(std::shared_ptr<Fabric> inner, int source)
        : ForwardingFabric(std::move(inner)), source_(source) {}

    void arm() {
        std::lock_guard<std::mutex> lock(mu_);
        armed_ = true;
        flagged_.clear();
    }
    void release() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            released_ = true;
        }
        cv_.notify_all();
    }
    bool awaitHeld() {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return held_; });
    }

    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override {
        Status st = inner().putFlag(peer, offset, value, deadline);
        std::lock_guard<std::mutex> lock(mu_);
        if (armed_)
            flagged_.insert(peer);
        return st;
    }
    uint8_t* peerWindow(int peer) override {
        std::unique_lock<std::mutex> lock(mu_);
        if (armed_ && peer == source_ && static_cast<int>(flagged_.size()) == size() - 1) {
            armed_ = false;
            held_ = true;
            cv_.notify_all();
            if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return released_; }))
                ADD_FAILURE() << "rank " << rank() << " was never released";
        }
        return inner().peerWindow(peer);
    }

private:
    const int source_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool armed_ = false;
    bool held_ = false;
    bool released_ = false;
    std::set<int> flagged_;
};

// Ranks 0 and 1 drop rank 2 right after the last call of epoch 1 and run
// epoch 2 while rank 2 is still about to copy rank 0's block of that call
// out of rank 0's window, where rank 0 published it. Epoch 2's senders wait
// only for epoch 2's members, so rank 0 republishes over that block before
// rank 2 reads it: rank 2 must fail the call, not return rank 0's epoch-2
// data as its epoch-1 block.
TEST(CollectivesEpoch, DroppedRankReadingInPlaceNeverTakesTheNextEpochsData) {
    const CommOptions options = testutil::smallOptions();
    const size_t block = 1000;  // one round, published to in-place readers
    ThreadFabricGroup group(3, Communicator::windowBytesFor(3, options));
    auto held = std::make_shared<HeldReaderFabric>(group.fabric(2), /*source=*/0);
    std::vector<std::unique_ptr<Communicator>> comms;
    comms.push_back(std::make_unique<Communicator>(group.fabric(0), options));
    comms.push_back(std::make_unique<Communicator>(group.fabric(1), options));
    comms.push_back(std::make_unique<Communicator>(held, options));

    Status dropped_call;
    std::vector<uint8_t> dropped_out(3 * block, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
        threads.emplace_back([&, r] {
            Communicator& c = *comms[r];
            ASSERT_TRUE(c.setMembership({1, 1, 1}, 1).ok());
            std::vector<uint8_t> in(block), out(3 * block);
            // The first call teaches every rank that the others map its window.
            testutil::fillPattern(in.data(), block, 10, r);
            ASSERT_TRUE(c.allGather(in.data(), out.data(), block, testutil::generous()).ok());
            testutil::fillPattern(in.data(), block, 11, r);
            if (r == 2) {
                held->arm();
                dropped_call =
                    c.allGather(in.data(), dropped_out.data(), block, testutil::generous());
                return;
            }
            Status st = c.allGather(in.data(), out.data(), block, testutil::generous());
            ASSERT_TRUE(st.ok()) << st.toString();
            for (int m = 0; m < 3; ++m)
                EXPECT_EQ(testutil::firstPatternMismatch(out.data() + m * block, block, 11, m), -1);
            ASSERT_TRUE(c.setMembership({1, 1, 0}, 2).ok());
            // Enough calls that rank 0 publishes into both of its slots.
            for (uint64_t seed = 20; seed < 24; ++seed) {
                testutil::fillPattern(in.data(), block, seed, r);
                st = c.allGather(in.data(), out.data(), block, testutil::generous());
                ASSERT_TRUE(st.ok()) << st.toString();
            }
        });
    }
    EXPECT_TRUE(held->awaitHeld()) << "rank 2 never reached its in-place read";
    threads[0].join();
    threads[1].join();
    held->release();
    threads[2].join();

    const long torn = testutil::firstPatternMismatch(dropped_out.data(), block, 11, 0);
    EXPECT_EQ(dropped_call.code(), StatusCode::kAborted)
        << dropped_call.toString() << "; rank 0's block "
        << (torn < 0 ? "is intact" : "differs at byte " + std::to_string(torn));
    EXPECT_NE(dropped_call.toString().find("rank 0 reused"), std::string::npos)
        << dropped_call.toString();
}

}  // namespace
}  // namespace mooncake::pg
