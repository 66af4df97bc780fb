// The IBGDA send/completion queue code (mlx5_queues.h) end to end against the
// software HCA (soft_hca.h): what an EP kernel will post, run from a host
// thread here (mlx5_queues_device.cu runs it from a kernel).
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"
#include "tests/cpp/rdma/soft_hca.h"

namespace mooncake::te::rdma {
namespace {

using mlx5::Completion;
using mlx5::CompletionQueue;
using mlx5::PutWithCount;
using mlx5::SendQueue;

std::vector<unsigned char> pattern(size_t bytes, unsigned seed) {
    std::vector<unsigned char> v(bytes);
    for (size_t i = 0; i < bytes; ++i)
        v[i] = static_cast<unsigned char>((i * 131 + seed * 7 + 1) & 0xff);
    return v;
}

uint64_t addr(const void* p) {
    return reinterpret_cast<uint64_t>(p);
}

// Sources, destinations and counters of `n` puts of varying length (every
// seventh only a count), each into its own slot of the destination.
struct Traffic {
    explicit Traffic(soft::SoftHca& hca, int n) : lengths(n), offsets(n), old_values(n, ~0ull) {
        size_t total = 0;
        for (int i = 0; i < n; ++i) {
            lengths[i] = i % 7 == 3 ? 0 : static_cast<uint32_t>((i * 37) % 300 + 1);
            offsets[i] = total;
            total += lengths[i];
        }
        source = pattern(total, 5);
        destination.assign(total, 0);
        src_key = hca.registerMemory(source.data(), source.size());
        dst_key = hca.registerMemory(destination.data(), destination.size());
        counter_key = hca.registerMemory(&counter, sizeof(counter));
        old_key = hca.registerMemory(old_values.data(), old_values.size() * sizeof(uint64_t));
    }

    PutWithCount put(int i) const {
        PutWithCount p;
        p.local_addr = addr(source.data() + offsets[i]);
        p.lkey = src_key;
        p.remote_addr = addr(destination.data() + offsets[i]);
        p.rkey = dst_key;
        p.length = lengths[i];
        p.counter_addr = addr(&counter);
        p.counter_rkey = counter_key;
        p.add = 1;
        p.old_value_addr = addr(&old_values[i]);
        p.old_value_lkey = old_key;
        return p;
    }

    bool arrived(int i) const {
        return std::memcmp(destination.data() + offsets[i], source.data() + offsets[i],
                           lengths[i]) == 0;
    }

    std::vector<uint32_t> lengths;
    std::vector<size_t> offsets;
    std::vector<unsigned char> source, destination;
    alignas(8) uint64_t counter = 0;
    std::vector<uint64_t> old_values;
    uint32_t src_key = 0, dst_key = 0, counter_key = 0, old_key = 0;
};

// Posts puts [0, n) in order, reaping completions whenever the queue is full,
// then waits until every WQE has completed. `step` runs after each attempt
// (the inline HCA's turn). Fails the test on an error completion or after 20 s.
template <typename Step>
void postAll(SendQueue& sq, CompletionQueue& cq, const Traffic& t, int n, Step step) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    Completion error;
    for (int i = 0; i < n; ++i) {
        while (!mlx5::postPutWithCount(sq, t.put(i))) {
            step();
            ASSERT_TRUE(mlx5::reapCompletions(cq, sq, &error))
                << "error completion: syndrome " << int(error.syndrome) << " at WQE "
                << error.wqe_counter;
            ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "stuck at put " << i;
        }
        step();
    }
    while (sq.consumer != sq.producer) {
        step();
        ASSERT_TRUE(mlx5::reapCompletions(cq, sq, &error)) << int(error.syndrome);
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "completions missing";
    }
}

// A producer thread and the HCA's thread run concurrently; a third thread
// watches the counter and checks that every put it counts has its data in
// place (the count must never overtake the data).
TEST(IbgdaQueue, PutsWithCountsArriveExactAndNeverBeforeTheirData) {
    soft::SoftHca hca;
    constexpr int kPuts = 3000;
    Traffic t(hca, kPuts);
    const int qp = hca.createQueuePair(16, 16);
    SendQueue sq = hca.sendQueue(qp);
    CompletionQueue cq = hca.completionQueue(qp);
    std::atomic<bool> done{false};
    std::atomic<int> early{-1};
    std::thread watcher([&] {
        uint64_t seen = 0;
        while (!done.load() && seen < kPuts) {
            const uint64_t c = mlx5::counterValue(&t.counter);
            std::atomic_thread_fence(std::memory_order_acquire);  // then read the data
            for (; seen < c; ++seen) {
                if (!t.arrived(static_cast<int>(seen)) && early.load() < 0)
                    early = static_cast<int>(seen);
            }
        }
    });
    hca.start();
    postAll(sq, cq, t, kPuts, [] {});
    done = true;
    watcher.join();
    hca.stop();
    EXPECT_EQ("", hca.violation());
    EXPECT_EQ(-1, early.load()) << "put " << early.load() << " counted before its data arrived";
    EXPECT_EQ(uint64_t{kPuts}, mlx5::counterValue(&t.counter));
    for (int i = 0; i < kPuts; ++i) {
        ASSERT_TRUE(t.arrived(i)) << "put " << i;
        // Each fetch-add returned the count before it: they ran in order.
        ASSERT_EQ(static_cast<uint64_t>(i), t.old_values[i]) << "put " << i;
    }
    EXPECT_GT(hca.doorbellsRung(qp), 0u);
}

// Starting just below 2^16 the 16-bit WQE indexes and counters wrap.
TEST(IbgdaQueue, SixteenBitIndexWrapsCleanly) {
    soft::SoftHca hca;
    constexpr int kPuts = 300;
    Traffic t(hca, kPuts);
    const int qp = hca.createQueuePair(8, 8, {}, 0x10000u - 21);
    SendQueue sq = hca.sendQueue(qp);
    CompletionQueue cq = hca.completionQueue(qp);
    postAll(sq, cq, t, kPuts, [&] { hca.process(qp); });
    EXPECT_EQ("", hca.violation());
    EXPECT_GT(sq.producer, 0x10000u);
    EXPECT_EQ(uint64_t{kPuts}, mlx5::counterValue(&t.counter));
    for (int i = 0; i < kPuts; ++i)
        ASSERT_TRUE(t.arrived(i)) << "put " << i;
}

TEST(IbgdaQueue, FullQueueRefusesUntilCompletionsRetireIt) {
    soft::SoftHca hca;
    Traffic t(hca, 3);
    const int qp = hca.createQueuePair(4, 4);
    SendQueue sq = hca.sendQueue(qp);
    CompletionQueue cq = hca.completionQueue(qp);
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(0)));
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(1)));
    EXPECT_EQ(4u, sq.producer);
    EXPECT_FALSE(mlx5::postPutWithCount(sq, t.put(2)));
    EXPECT_EQ(4u, sq.producer) << "a refused post must leave the queue as it was";
    EXPECT_EQ(mlx5::sendDoorbellValue(4), sq.dbrec[mlx5::kSendDoorbellIndex]);
    // The doorbell carries the first 8 bytes of the last WQE (the fetch-add at 3).
    EXPECT_EQ(0, std::memcmp(const_cast<uint64_t*>(sq.doorbell), mlx5::basicBlockAt(sq, 3), 8));
    Completion c;
    EXPECT_FALSE(mlx5::pollCompletion(cq, &c)) << "nothing executed yet";
    EXPECT_EQ(4u, hca.process(qp));
    Completion error;
    ASSERT_TRUE(mlx5::reapCompletions(cq, sq, &error));
    EXPECT_EQ(2u, cq.consumer) << "one CQE per put: only the fetch-add is signaled";
    EXPECT_EQ(sq.producer, sq.consumer);
    EXPECT_TRUE(mlx5::postPutWithCount(sq, t.put(2)));
    EXPECT_EQ(2u, hca.process(qp));
    EXPECT_EQ(3u, mlx5::counterValue(&t.counter));
    EXPECT_EQ("", hca.violation());
}

TEST(IbgdaQueue, RemoteAccessErrorFailsThatPutAndFlushesTheRest) {
    soft::SoftHca hca;
    Traffic t(hca, 4);
    const int qp = hca.createQueuePair(16, 16);
    SendQueue sq = hca.sendQueue(qp);
    CompletionQueue cq = hca.completionQueue(qp);
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(0)));  // WQEs 0, 1
    PutWithCount bad = t.put(1);
    bad.rkey = 999;                                     // never registered
    ASSERT_TRUE(mlx5::postPutWithCount(sq, bad));       // WQEs 2, 3
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(2)));  // WQEs 4, 5
    hca.process(qp);
    Completion error;
    EXPECT_FALSE(mlx5::reapCompletions(cq, sq, &error));
    EXPECT_EQ(mlx5::kCqeRequesterError, error.opcode);
    EXPECT_EQ(mlx5::kSyndromeRemoteAccess, error.syndrome);
    EXPECT_EQ(2, error.wqe_counter) << "the failed WRITE";
    EXPECT_EQ(2u, sq.consumer) << "the first put completed before the error";
    // The QP is in error now: everything after the failed WQE is flushed, one
    // CQE each, signaled or not.
    for (uint16_t index : {3, 4, 5}) {
        Completion c;
        ASSERT_TRUE(mlx5::pollCompletion(cq, &c));
        EXPECT_EQ(mlx5::kSyndromeFlushed, c.syndrome);
        EXPECT_EQ(index, c.wqe_counter);
    }
    EXPECT_TRUE(t.arrived(0));
    EXPECT_FALSE(t.arrived(2));
    EXPECT_EQ(1u, mlx5::counterValue(&t.counter));
}

TEST(IbgdaQueue, CountOnlyPutTakesOneWqe) {
    soft::SoftHca hca;
    Traffic t(hca, 4);  // put 3 has length 0
    ASSERT_EQ(0u, t.lengths[3]);
    const int qp = hca.createQueuePair(4, 4);
    SendQueue sq = hca.sendQueue(qp);
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(3)));
    EXPECT_EQ(1u, sq.producer);
    EXPECT_EQ(1u, hca.process(qp));
    EXPECT_EQ(1u, mlx5::counterValue(&t.counter));
    EXPECT_EQ("", hca.violation());
}

// The reason the CQ must be as large as the send queue: count-only puts, one
// BB and one CQE each, fill a smaller CQ before the send queue is full.
TEST(IbgdaQueue, CompletionQueueSmallerThanTheSendQueueOverruns) {
    EXPECT_TRUE(mlx5::completionQueueFits(16, 16));
    EXPECT_FALSE(mlx5::completionQueueFits(16, 8));
    soft::SoftHca hca;
    Traffic t(hca, 4);
    const int qp = hca.createQueuePair(8, 4);
    SendQueue sq = hca.sendQueue(qp);
    for (int i = 0; i < 5; ++i)
        ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(3))) << i;  // count only
    hca.process(qp);
    EXPECT_NE(std::string::npos, hca.violation().find("CQ overrun")) << hca.violation();
}

// The HCA checks each WQE's index: a producer that skipped one is caught.
TEST(IbgdaQueue, SoftHcaRejectsAWqeWithTheWrongIndex) {
    soft::SoftHca hca;
    Traffic t(hca, 2);
    const int qp = hca.createQueuePair(4, 4);
    SendQueue sq = hca.sendQueue(qp);
    sq.producer = 1;  // out of step with the HCA, which expects index 0
    sq.consumer = 1;
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(0)));
    hca.process(qp);
    EXPECT_NE(std::string::npos, hca.violation().find("carries index")) << hca.violation();
}

// A doorbell rung before its record announces the WQE it names: a real HCA
// may miss that WQE until the next ring.
TEST(IbgdaQueue, SoftHcaRejectsADoorbellRungBeforeItsRecord) {
    soft::SoftHca hca;
    Traffic t(hca, 2);
    const int qp = hca.createQueuePair(4, 4);
    SendQueue sq = hca.sendQueue(qp);
    mlx5::postWrite(sq, t.put(0).local_addr, t.src_key, t.put(0).remote_addr, t.dst_key,
                    t.lengths[0], true);
    mlx5::storeDoorbell(sq.doorbell, sq.doorbell_word);  // the record still says 0
    EXPECT_EQ(0u, hca.process(qp));
    EXPECT_NE(std::string::npos, hca.violation().find("rung before the record")) << hca.violation();
}

// A doorbell word must not go back to a WQE before the one an earlier word
// named, even one long executed (which the head check cannot see).
TEST(IbgdaQueue, SoftHcaRejectsADoorbellWordThatGoesBack) {
    soft::SoftHca hca;
    Traffic t(hca, 4);  // put 3 is a count only: one WQE
    const int qp = hca.createQueuePair(4, 4);
    SendQueue sq = hca.sendQueue(qp);
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(3)));
    const uint64_t first_word = sq.doorbell_word;
    ASSERT_TRUE(mlx5::postPutWithCount(sq, t.put(3)));
    EXPECT_EQ(2u, hca.process(qp));
    EXPECT_EQ("", hca.violation());
    mlx5::storeDoorbell(sq.doorbell, first_word);
    hca.process(qp);
    EXPECT_NE(std::string::npos, hca.violation().find("a stale word")) << hca.violation();
}

}  // namespace
}  // namespace mooncake::te::rdma
