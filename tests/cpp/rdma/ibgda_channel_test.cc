// The shared IBGDA channel of the EP kernels (mooncake-ep/ibgda/channel.h)
// against the software HCA, from host threads standing in for the send
// blocks: several posters on one QP, WRITEs that outnumber the ring, a peer
// that stops executing, an error completion, a lock that is never released.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mooncake-ep/ibgda/channel.h"
#include "tests/cpp/rdma/soft_hca.h"

namespace mooncake::ep {
namespace {

using te::rdma::soft::SoftHca;

constexpr auto nowNs = te::rdma::soft::steadyNowNs;

int64_t deadlineIn(std::chrono::milliseconds d) {
    return nowNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

uint64_t addr(const void* p) {
    return reinterpret_cast<uint64_t>(p);
}

IbgdaChannel channelOf(SoftHca& hca, int qp) {
    IbgdaChannel ch;
    ch.sq = hca.sendQueue(qp);
    ch.cq = hca.completionQueue(qp);
    return ch;
}

// Source and destination of `slots` fixed-size messages, and counters.
struct Memory {
    Memory(SoftHca& hca, size_t slots, size_t slot_bytes)
        : slot_bytes(slot_bytes), source(slots * slot_bytes), destination(slots * slot_bytes, 0) {
        for (size_t i = 0; i < source.size(); ++i)
            source[i] = static_cast<unsigned char>((i * 29 + 7) & 0xff);
        src_key = hca.registerMemory(source.data(), source.size());
        dst_key = hca.registerMemory(destination.data(), destination.size());
        counter_key = hca.registerMemory(counters, sizeof(counters));
        scratch_key = hca.registerMemory(&scratch, sizeof(scratch));
    }

    IbgdaStatus write(IbgdaChannel* ch, size_t slot, int64_t deadline) {
        return ibgdaWrite(ch, addr(source.data() + slot * slot_bytes), src_key,
                          addr(destination.data() + slot * slot_bytes), dst_key,
                          static_cast<uint32_t>(slot_bytes), deadline, nowNs);
    }

    // The count only (no data): adds `add` to counters[which].
    IbgdaStatus count(IbgdaChannel* ch, int which, uint64_t add, int64_t deadline) {
        mlx5q::PutWithCount p;
        p.counter_addr = addr(&counters[which]);
        p.counter_rkey = counter_key;
        p.add = add;
        p.old_value_addr = addr(&scratch);
        p.old_value_lkey = scratch_key;
        return ibgdaPutWithCount(ch, p, deadline, nowNs);
    }

    bool arrived(size_t slot) const {
        return std::memcmp(destination.data() + slot * slot_bytes,
                           source.data() + slot * slot_bytes, slot_bytes) == 0;
    }

    size_t slot_bytes;
    std::vector<unsigned char> source, destination;
    alignas(8) uint64_t counters[8] = {};
    alignas(8) uint64_t scratch = 0;
    uint32_t src_key = 0, dst_key = 0, counter_key = 0, scratch_key = 0;
};

// Four posters (the blocks sending to one peer) share a 16-WQE QP while the
// HCA runs: every message lands, every count adds exactly once, and the HCA
// sees WQE indexes in order (no two posters took the same slot).
TEST(IbgdaChannel, ManyPostersShareOneQueuePairAndEverythingArrivesOnce) {
    SoftHca hca;
    constexpr int kPosters = 4;
    constexpr size_t kPerPoster = 400;
    Memory m(hca, kPosters * kPerPoster, 40);
    const int qp = hca.createQueuePair(16, 16);
    IbgdaChannel ch = channelOf(hca, qp);
    hca.start();
    std::vector<std::thread> posters;
    std::atomic<int> failures{0};
    for (int t = 0; t < kPosters; ++t) {
        posters.emplace_back([&, t] {
            const int64_t deadline = deadlineIn(std::chrono::seconds(20));
            for (size_t i = 0; i < kPerPoster; ++i) {
                if (m.write(&ch, t * kPerPoster + i, deadline) != IbgdaStatus::kOk)
                    ++failures;
                if (i % 5 == 4 && m.count(&ch, t, 1, deadline) != IbgdaStatus::kOk)
                    ++failures;
            }
            if (m.count(&ch, t, 1000, deadline) != IbgdaStatus::kOk ||
                ibgdaQuiet(&ch, deadline, nowNs) != IbgdaStatus::kOk)
                ++failures;
        });
    }
    for (auto& t : posters)
        t.join();
    hca.stop();
    EXPECT_EQ(0, failures.load());
    EXPECT_EQ("", hca.violation());
    for (int t = 0; t < kPosters; ++t)
        EXPECT_EQ(kPerPoster / 5 + 1000, m.counters[t]) << "poster " << t;
    for (size_t s = 0; s < kPosters * kPerPoster; ++s)
        ASSERT_TRUE(m.arrived(s)) << "slot " << s;
    EXPECT_EQ(ch.sq.producer, ch.sq.consumer) << "the quiets saw every WQE complete";
    EXPECT_EQ(0, ch.lock);
}

// A combine block posts a WRITE per row and one count at the end: far more
// WRITEs than the ring holds must still make progress, because some of them
// ask for completions.
TEST(IbgdaChannel, WritesOutnumberingTheRingStillMakeProgress) {
    SoftHca hca;
    Memory m(hca, 100, 24);
    const int qp = hca.createQueuePair(kIbgdaMinChannelWqes, kIbgdaMinChannelWqes);
    IbgdaChannel ch = channelOf(hca, qp);
    hca.start();
    const int64_t deadline = deadlineIn(std::chrono::seconds(20));
    for (size_t s = 0; s < 100; ++s)
        ASSERT_EQ(IbgdaStatus::kOk, m.write(&ch, s, deadline)) << "write " << s;
    ASSERT_EQ(IbgdaStatus::kOk, m.count(&ch, 0, 100, deadline));
    ASSERT_EQ(IbgdaStatus::kOk, ibgdaQuiet(&ch, deadline, nowNs));
    hca.stop();
    EXPECT_EQ("", hca.violation());
    EXPECT_EQ(100u, m.counters[0]);
    for (size_t s = 0; s < 100; ++s)
        ASSERT_TRUE(m.arrived(s)) << "slot " << s;
}

// A combine warp's rows go in one turn of the lock (ibgdaWriteMany): three
// posters queue batches of 7 through an 8-WQE ring, each declining every
// fifth slot; what was described arrives, what was declined does not.
TEST(IbgdaChannel, BatchedWritesArriveAndDeclinedOnesAreSkipped) {
    SoftHca hca;
    constexpr int kPosters = 3;
    constexpr size_t kPerPoster = 210;
    Memory m(hca, kPosters * kPerPoster, 32);
    const int qp = hca.createQueuePair(kIbgdaMinChannelWqes, kIbgdaMinChannelWqes);
    IbgdaChannel ch = channelOf(hca, qp);
    hca.start();
    std::atomic<int> failures{0};
    std::vector<std::thread> posters;
    for (int t = 0; t < kPosters; ++t) {
        posters.emplace_back([&, t] {
            const int64_t deadline = deadlineIn(std::chrono::seconds(20));
            for (size_t first = 0; first < kPerPoster; first += 7) {
                const IbgdaStatus st = ibgdaWriteMany(
                    &ch, 7, m.src_key, m.dst_key,
                    [&](int j, uint64_t* local, uint64_t* remote, uint32_t* bytes) {
                        const size_t slot = t * kPerPoster + first + j;
                        if ((first + j) % 5 == 4)
                            return false;
                        *local = addr(m.source.data() + slot * m.slot_bytes);
                        *remote = addr(m.destination.data() + slot * m.slot_bytes);
                        *bytes = static_cast<uint32_t>(m.slot_bytes);
                        return true;
                    },
                    deadline, nowNs);
                if (st != IbgdaStatus::kOk)
                    ++failures;
            }
            if (m.count(&ch, t, 1, deadline) != IbgdaStatus::kOk ||
                ibgdaQuiet(&ch, deadline, nowNs) != IbgdaStatus::kOk)
                ++failures;
        });
    }
    for (auto& th : posters)
        th.join();
    hca.stop();
    EXPECT_EQ(0, failures.load());
    EXPECT_EQ("", hca.violation());
    const std::vector<unsigned char> zeros(m.slot_bytes, 0);
    for (int t = 0; t < kPosters; ++t) {
        EXPECT_EQ(1u, m.counters[t]);
        for (size_t k = 0; k < kPerPoster; ++k) {
            const size_t slot = t * kPerPoster + k;
            if (k % 5 == 4) {
                ASSERT_EQ(0, std::memcmp(m.destination.data() + slot * m.slot_bytes, zeros.data(),
                                         m.slot_bytes))
                    << "declined slot " << slot << " was written";
            } else {
                ASSERT_TRUE(m.arrived(slot)) << "slot " << slot;
            }
        }
    }
}

// A peer whose NIC stops executing (its host died): posting fills the ring
// and then gives up at the deadline, as does a quiet, and the lock is free.
TEST(IbgdaChannel, StalledQueueTimesOutAtTheDeadline) {
    SoftHca hca;  // never started: nothing executes
    Memory m(hca, 64, 16);
    const int qp = hca.createQueuePair(16, 16);
    IbgdaChannel ch = channelOf(hca, qp);
    const int64_t deadline = deadlineIn(std::chrono::milliseconds(100));
    IbgdaStatus st = IbgdaStatus::kOk;
    size_t posted = 0;
    while (posted < 64 && (st = m.write(&ch, posted, deadline)) == IbgdaStatus::kOk)
        ++posted;
    EXPECT_EQ(IbgdaStatus::kTimedOut, st);
    EXPECT_EQ(16u, posted) << "the ring's worth went in, then the wait for room timed out";
    EXPECT_GT(nowNs(), deadline);
    EXPECT_EQ(IbgdaStatus::kTimedOut,
              ibgdaQuiet(&ch, deadlineIn(std::chrono::milliseconds(50)), nowNs));
    EXPECT_EQ(0, ch.lock);
    EXPECT_EQ(16u, ch.rung) << "waiting for room announced what was queued";
}

// An error completion (here a bad rkey) fails the channel for good: the
// syndrome is kept and later calls return at once without posting.
TEST(IbgdaChannel, ErrorCompletionFailsTheChannelForGood) {
    SoftHca hca;
    Memory m(hca, 4, 16);
    const int qp = hca.createQueuePair(16, 16);
    IbgdaChannel ch = channelOf(hca, qp);
    const int64_t deadline = deadlineIn(std::chrono::seconds(5));
    ASSERT_EQ(IbgdaStatus::kOk, m.write(&ch, 0, deadline));
    m.dst_key = 12345;  // a key the peer never registered
    ASSERT_EQ(IbgdaStatus::kOk, m.write(&ch, 1, deadline));
    ASSERT_EQ(IbgdaStatus::kOk, m.count(&ch, 0, 1, deadline));
    hca.processAll();
    EXPECT_EQ(IbgdaStatus::kQpError, ibgdaQuiet(&ch, deadline, nowNs));
    EXPECT_EQ(1, ch.failed);
    EXPECT_EQ(te::rdma::mlx5::kSyndromeRemoteAccess, ch.syndrome);
    const uint32_t producer = ch.sq.producer;
    EXPECT_EQ(IbgdaStatus::kQpError, m.write(&ch, 2, deadline));
    EXPECT_EQ(IbgdaStatus::kQpError, m.count(&ch, 0, 1, deadline));
    EXPECT_EQ(producer, ch.sq.producer) << "a failed channel posts nothing";
    EXPECT_TRUE(m.arrived(0));
    EXPECT_FALSE(m.arrived(1));
    EXPECT_EQ(0u, m.counters[0]) << "the count behind the failed WRITE was flushed";
    EXPECT_EQ(0, ch.lock);
}

// A holder that never lets go (a block killed mid-post cannot happen, but a
// bug could): the others give up at their deadline instead of spinning.
TEST(IbgdaChannel, LockNeverReleasedTimesOut) {
    SoftHca hca;
    Memory m(hca, 1, 16);
    const int qp = hca.createQueuePair(16, 16);
    IbgdaChannel ch = channelOf(hca, qp);
    ch.lock = 1;
    EXPECT_EQ(IbgdaStatus::kTimedOut, m.write(&ch, 0, deadlineIn(std::chrono::milliseconds(20))));
    EXPECT_EQ(IbgdaStatus::kTimedOut,
              ibgdaQuiet(&ch, deadlineIn(std::chrono::milliseconds(20)), nowNs));
    EXPECT_EQ(0u, ch.sq.producer);
}

}  // namespace
}  // namespace mooncake::ep
