// P2PEngine over ThreadFabricGroup: byte-exact delivery, matching order,
// flow control through small pools, failures, timeouts and slot validation.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/core/p2p/slots.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg {
namespace {

using namespace p2p_test;
using namespace std::chrono_literals;

TEST(P2P, RecvBeforeSendByteExact) {
    Group g(2, smallOptions());
    for (size_t bytes : kSizes) {
        SCOPED_TRACE("bytes=" + std::to_string(bytes));
        auto want = pattern(bytes, 1);
        std::vector<uint8_t> got(bytes, 0xee);
        auto r = postRecv(g[0], got, 1, 5);
        auto s = postSend(g[1], want, 0, 5);
        EXPECT_TRUE(s->wait().ok());
        ASSERT_TRUE(r->wait().ok());
        EXPECT_EQ(got, want);
    }
}

TEST(P2P, SendBeforeRecvByteExact) {
    Group g(2, smallOptions());
    for (size_t bytes : kSizes) {
        SCOPED_TRACE("bytes=" + std::to_string(bytes));
        auto want = pattern(bytes, 2);
        std::vector<uint8_t> got(bytes, 0xee);
        auto s = postSend(g[1], want, 0, 9);
        auto r = postRecv(g[0], got, 1, 9);
        ASSERT_TRUE(r->wait().ok());
        EXPECT_TRUE(s->wait().ok());
        EXPECT_EQ(got, want);
    }
}

TEST(P2P, SendCompletesBeforeReceiverPosts) {
    Group g(2, smallOptions());
    auto want = pattern(3001, 3);  // fits the 4 KiB send pool
    auto s = postSend(g[1], want, 0, 1, Deadline::after(10s));
    // No recv is posted until the send has completed: a send that waited for
    // its receiver would time out here instead.
    ASSERT_TRUE(s->wait().ok());
    std::fill(want.begin(), want.end(), 0);  // the buffer is the caller's again
    std::vector<uint8_t> got(3001);
    ASSERT_TRUE(postRecv(g[0], got, 1, 1)->wait().ok());
    EXPECT_EQ(got, pattern(3001, 3));
}

TEST(P2P, OutOfOrderTags) {
    Group g(2, smallOptions());
    const size_t sizes[] = {0, 1500, 700, 2100};  // by tag; more than one pool in total
    std::vector<std::vector<uint8_t>> want, got;
    for (int tag = 0; tag <= 3; ++tag) {
        want.push_back(pattern(sizes[tag], tag));
        got.emplace_back(sizes[tag], 0);
    }
    std::vector<std::shared_ptr<Completion>> sends, recvs;
    for (int tag : {1, 2, 3})
        sends.push_back(postSend(g[1], want[tag], 0, tag));
    for (int tag : {3, 1, 2})
        recvs.push_back(postRecv(g[0], got[tag], 1, tag));
    for (auto& c : recvs) {
        Status st = c->wait();
        ASSERT_TRUE(st.ok()) << st.toString();
    }
    for (auto& c : sends) {
        Status st = c->wait();
        ASSERT_TRUE(st.ok()) << st.toString();
    }
    for (int tag : {1, 2, 3})
        EXPECT_EQ(got[tag], want[tag]) << "tag " << tag;
}

TEST(P2P, SameTagMatchesInPostingOrder) {
    Group g(2, smallOptions());
    std::vector<std::vector<uint8_t>> want, got;
    for (int i = 0; i < 6; ++i) {
        want.push_back(pattern(900 + 450 * i, i));
        got.emplace_back(want.back().size(), 0);
    }
    std::vector<std::shared_ptr<Completion>> ops;
    for (int i = 0; i < 6; ++i)
        ops.push_back(postSend(g[1], want[i], 0, 4));
    for (int i = 0; i < 6; ++i)
        ops.push_back(postRecv(g[0], got[i], 1, 4));
    for (auto& c : ops)
        ASSERT_TRUE(c->wait().ok());
    EXPECT_EQ(got, want);
}

TEST(P2P, ManyToOne) {
    Group g(4, smallOptions());
    std::vector<std::vector<uint8_t>> got(8);
    runRanks(4, [&](int rank) {
        if (rank == 0) {
            std::vector<std::shared_ptr<Completion>> recvs;
            for (int src = 1; src < 4; ++src) {
                for (int tag = 0; tag < 2; ++tag) {
                    auto& buf = got[src * 2 + tag];
                    buf.assign(2000 + 1500 * tag + src, 0);
                    recvs.push_back(postRecv(g[0], buf, src, tag));
                }
            }
            for (auto& c : recvs)
                EXPECT_TRUE(c->wait().ok());
        } else {
            std::vector<std::vector<uint8_t>> bufs;
            for (int tag = 0; tag < 2; ++tag)
                bufs.push_back(pattern(2000 + 1500 * tag + rank, rank));
            auto a = postSend(g[rank], bufs[0], 0, 0);
            auto b = postSend(g[rank], bufs[1], 0, 1);
            EXPECT_TRUE(a->wait().ok());
            EXPECT_TRUE(b->wait().ok());
        }
    });
    for (int src = 1; src < 4; ++src) {
        for (int tag = 0; tag < 2; ++tag) {
            EXPECT_EQ(got[src * 2 + tag], pattern(2000 + 1500 * tag + src, src));
        }
    }
}

TEST(P2P, RingAllPostedBeforeWait) {
    constexpr int kRanks = 4;
    constexpr size_t kBytes = 10000;  // more than two pools
    Group g(kRanks, smallOptions());
    std::vector<std::vector<uint8_t>> got(kRanks);
    runRanks(kRanks, [&](int rank) {
        auto want = pattern(kBytes, rank);
        got[rank].assign(kBytes, 0);
        auto s = postSend(g[rank], want, (rank + 1) % kRanks, 0);
        auto r = postRecv(g[rank], got[rank], (rank + kRanks - 1) % kRanks, 0);
        EXPECT_TRUE(s->wait().ok());
        EXPECT_TRUE(r->wait().ok());
    });
    for (int r = 0; r < kRanks; ++r)
        EXPECT_EQ(got[r], pattern(kBytes, (r + kRanks - 1) % kRanks));
}

TEST(P2P, SizeMismatchFailsBothSides) {
    Group g(2, smallOptions());
    // 6000 bytes cannot be fully staged in a 4 KiB pool before the recv's
    // credits arrive, so the sender is still pending when it sees them.
    expectSizeMismatchFailsBothSides(g);
}

TEST(P2P, SizeMismatchAfterSendCompletedFailsRecv) {
    Group g(2, smallOptions());
    auto want = pattern(100, 1);
    ASSERT_TRUE(postSend(g[1], want, 0, 3)->wait().ok());
    std::vector<uint8_t> got(200);
    Status rs = postRecv(g[0], got, 1, 3)->wait();
    EXPECT_EQ(rs.code(), StatusCode::kInvalidArgument) << rs.toString();
    EXPECT_NE(rs.message().find("100"), std::string::npos) << rs.toString();
    EXPECT_NE(rs.message().find("200"), std::string::npos) << rs.toString();
}

TEST(P2P, KilledPeerFailsPendingOpsQuickly) {
    Group g(3, smallOptions());
    auto big = pattern(10000, 1);  // larger than the pool: stays pending
    std::vector<uint8_t> got(10);
    auto r = postRecv(g[0], got, 1, 0, Deadline::after(30s));
    auto s = postSend(g[0], big, 1, 0, Deadline::after(30s));
    g.fabrics.kill(1);
    // kPeerFailure, not their deadline's kTimeout: the death was noticed.
    EXPECT_EQ(r->wait().code(), StatusCode::kPeerFailure);
    EXPECT_EQ(s->wait().code(), StatusCode::kPeerFailure);
    // New operations with the dead peer fail at once; other pairs still work.
    EXPECT_EQ(g[0].recv(got.data(), got.size(), 1, 0, Deadline::after(1s), [](Status) {}).code(),
              StatusCode::kPeerFailure);
    auto want = pattern(2500, 4);
    std::vector<uint8_t> got2(2500);
    auto s2 = postSend(g[2], want, 0, 0);
    ASSERT_TRUE(postRecv(g[0], got2, 2, 0)->wait().ok());
    EXPECT_TRUE(s2->wait().ok());
    EXPECT_EQ(got2, want);
}

TEST(P2P, SendLargerThanPoolWithoutRecvTimesOut) {
    Group g(2, smallOptions());
    auto big = pattern(10000, 1);
    auto start = std::chrono::steady_clock::now();
    Status st = postSend(g[1], big, 0, 0, Deadline::after(200ms))->wait();
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_GE(took, 200ms);  // not early; how late is load's business
}

TEST(P2P, RecvWithoutSenderTimesOut) {
    Group g(2, smallOptions());
    std::vector<uint8_t> got(3000);
    auto start = std::chrono::steady_clock::now();
    Status st = postRecv(g[0], got, 1, 0, Deadline::after(200ms))->wait();
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_GE(took, 200ms);  // not early; how late is load's business
}

TEST(P2P, RecvTimeoutDoesNotWedgeThePair) {
    Group g(2, smallOptions());
    // R1 takes the whole receive pool in credits, then times out with them
    // outstanding.
    std::vector<uint8_t> got(10000);
    EXPECT_EQ(postRecv(g[0], got, 1, 0, Deadline::after(100ms))->wait().code(),
              StatusCode::kTimeout);
    // M1 is bound to R1's orphaned credits; it cannot be fully staged, and the
    // next recv (a new recv id) makes the sender drop it.
    auto m1 = pattern(10000, 1);
    auto s1 = postSend(g[1], m1, 0, 0);
    auto r2 = postRecv(g[0], got, 1, 0);
    Status st = s1->wait();
    EXPECT_EQ(st.code(), StatusCode::kAborted) << st.toString();
    auto m2 = pattern(10000, 2);
    auto s2 = postSend(g[1], m2, 0, 0);
    st = r2->wait();
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_TRUE(s2->wait().ok());
    EXPECT_EQ(got, m2);
}

TEST(P2P, SendTimeoutMidMessageFailsRecvPromptly) {
    Group g(2, smallOptions());
    // M0 (never received yet) fills the whole send pool, so M1 cannot stage.
    auto m0 = pattern(4096, 0);
    ASSERT_TRUE(postSend(g[1], m0, 0, 5)->wait().ok());
    auto m1 = pattern(2000, 1);
    auto s1 = postSend(g[1], m1, 0, 0, Deadline::after(200ms));
    std::vector<uint8_t> got(2000);
    auto r1 = postRecv(g[0], got, 1, 0, Deadline::after(20s));
    EXPECT_EQ(s1->wait().code(), StatusCode::kTimeout);
    // R1's credits are answered "abandoned": it fails now, not in 20 s.
    Status st = r1->wait(5s);
    EXPECT_EQ(st.code(), StatusCode::kAborted) << st.toString();
    // Everything else still flows.
    std::vector<uint8_t> got0(4096);
    ASSERT_TRUE(postRecv(g[0], got0, 1, 5)->wait().ok());
    EXPECT_EQ(got0, m0);
    auto s2 = postSend(g[1], m1, 0, 0);
    ASSERT_TRUE(postRecv(g[0], got, 1, 0)->wait().ok());
    EXPECT_TRUE(s2->wait().ok());
    EXPECT_EQ(got, m1);
}

TEST(P2P, ZeroByteMismatches) {
    Group g(2, smallOptions());
    for (auto [send_bytes, recv_bytes] : {std::pair<size_t, size_t>{0, 10}, {10, 0}}) {
        auto want = pattern(send_bytes, 1);
        std::vector<uint8_t> got(recv_bytes);
        ASSERT_TRUE(postSend(g[1], want, 0, 0)->wait().ok());
        Status st = postRecv(g[0], got, 1, 0)->wait();
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    }
}

// Writes a credit for rank 1 -> rank 0 (tag 7, 1 byte) into rank 1's credit
// ring slot 0, as rank 0 would; with `footer` false only the body lands.
void forgeCredit(Group& g, uint32_t epoch, bool footer) {
    p2p::Layout layout(2, g.options);
    p2p::CreditSlot s{};
    s.header = s.footer = p2p::slotToken(epoch, 0);
    s.recv_id = 99;
    s.tag = 7;
    s.length = 1;
    s.message_bytes = 1;
    auto f0 = g.fabrics.fabric(0);
    uint64_t at = layout.creditIn(0, 0);
    ASSERT_TRUE(
        f0->put(1, at, &s, offsetof(p2p::CreditSlot, footer), Deadline::afterMs(10000)).ok());
    if (footer) {
        ASSERT_TRUE(f0->putFlag(1, at + offsetof(p2p::CreditSlot, footer), s.footer,
                                Deadline::afterMs(10000))
                        .ok());
    }
}

// Posts a 1-byte send on tag 7 from rank 1, lets rank 1's progress thread run
// several passes over the forged slot, checks it was not consumed, and then
// checks a real recv still gets the byte.
void expectForgedCreditIgnored(Group& g) {
    std::vector<uint8_t> one = {0x5a};
    auto s = postSend(g[1], one, 0, 7);
    ASSERT_TRUE(s->wait().ok());
    uint64_t passes = g[1].stats().progress_passes;
    ASSERT_TRUE(eventually([&] { return g[1].stats().progress_passes >= passes + 20; }));
    EXPECT_EQ(g[1].stats().credits_received, 0u);
    std::vector<uint8_t> got(1);
    ASSERT_TRUE(postRecv(g[0], got, 1, 7)->wait().ok());
    EXPECT_EQ(got[0], 0x5a);
    EXPECT_EQ(g[1].stats().credits_received, 1u);
}

TEST(P2P, TornSlotIsNotConsumed) {
    Group g(2, smallOptions());
    forgeCredit(g, /*epoch=*/0, /*footer=*/false);
    expectForgedCreditIgnored(g);
}

TEST(P2P, StaleEpochSlotIgnoredAfterSetEpoch) {
    Group g(2, smallOptions());
    std::vector<uint8_t> buf(10);
    auto pending = postRecv(g[0], buf, 1, 0);
    ASSERT_TRUE(g[0].setEpoch(1).ok());
    ASSERT_TRUE(g[1].setEpoch(1).ok());
    EXPECT_EQ(pending->wait().code(), StatusCode::kAborted);
    forgeCredit(g, /*epoch=*/0, /*footer=*/true);  // complete, but epoch 0
    expectForgedCreditIgnored(g);
}

TEST(P2P, InactivePeerFailsWithPeerFailure) {
    Group g(3, smallOptions());
    std::vector<uint8_t> buf(10);
    auto pending = postRecv(g[0], buf, 2, 0);
    ASSERT_TRUE(g[0].setEpoch(1, {1, 1, 0}).ok());
    ASSERT_TRUE(g[1].setEpoch(1, {1, 1, 0}).ok());
    EXPECT_EQ(pending->wait().code(), StatusCode::kPeerFailure);
    EXPECT_EQ(g[0].setEpoch(65537).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(g[0].send(buf.data(), buf.size(), 2, 0, Deadline::after(1s), [](Status) {}).code(),
              StatusCode::kPeerFailure);
    auto want = pattern(5000, 1);
    std::vector<uint8_t> got(5000);
    auto s = postSend(g[1], want, 0, 0);
    ASSERT_TRUE(postRecv(g[0], got, 1, 0)->wait().ok());
    EXPECT_TRUE(s->wait().ok());
    EXPECT_EQ(got, want);
}

TEST(P2P, SameEpochMaskChangeKeepsOtherPairsGoing) {
    Group g(3, smallOptions());
    std::vector<uint8_t> from2(10), from1(3000);
    auto r2 = postRecv(g[0], from2, 2, 0);
    auto r1 = postRecv(g[0], from1, 1, 0);
    ASSERT_TRUE(g[0].setEpoch(0, {1, 1, 0}).ok());
    EXPECT_EQ(r2->wait().code(), StatusCode::kPeerFailure);
    EXPECT_FALSE(r1->done());
    auto want = pattern(3000, 1);
    auto s = postSend(g[1], want, 0, 0);
    ASSERT_TRUE(r1->wait().ok());
    EXPECT_TRUE(s->wait().ok());
    EXPECT_EQ(from1, want);
}

TEST(P2P, DestructorAbortsPendingOps) {
    auto g = std::make_unique<Group>(2, smallOptions());
    std::vector<uint8_t> buf(10);
    auto r = postRecv((*g)[0], buf, 1, 0);
    g.reset();
    EXPECT_EQ(r->wait(1s).code(), StatusCode::kAborted);
}

TEST(P2P, InvalidArguments) {
    Group g(2, smallOptions());
    std::vector<uint8_t> buf(8);
    auto noop = [](Status) { ADD_FAILURE() << "callback of a rejected op"; };
    EXPECT_EQ(g[0].send(buf.data(), 8, 0, 0, Deadline::after(1s), noop).code(),
              StatusCode::kInvalidArgument);  // self
    EXPECT_EQ(g[0].recv(buf.data(), 8, 2, 0, Deadline::after(1s), noop).code(),
              StatusCode::kInvalidArgument);  // no rank 2
    EXPECT_EQ(g[0].send(nullptr, 8, 1, 0, Deadline::after(1s), noop).code(),
              StatusCode::kInvalidArgument);
    // A window too small for the P2P area.
    ThreadFabricGroup tiny(2, 1024);
    P2PEngine e(tiny.fabric(0), smallOptions());
    EXPECT_EQ(e.send(buf.data(), 8, 1, 0, Deadline::after(1s), noop).code(),
              StatusCode::kInvalidArgument);
}

TEST(P2P, IdleEngineDoesNotPoll) {
    Group g(2, smallOptions());
    auto want = pattern(100, 1);
    std::vector<uint8_t> got(100);
    auto s = postSend(g[1], want, 0, 0);
    ASSERT_TRUE(postRecv(g[0], got, 1, 0)->wait().ok());
    ASSERT_TRUE(s->wait().ok());
    // With nothing pending, each progress thread must end up in its untimed
    // wait (a polling engine never does); then it makes no pass at all.
    for (int r = 0; r < 2; ++r) {
        const Deadline deadline = Deadline::after(10s);
        while (!g[r].stats().parked && !deadline.expired())
            std::this_thread::yield();
        const P2PStats first = g[r].stats();
        ASSERT_TRUE(first.parked) << "rank " << r << "'s idle progress thread never parked";
        const P2PStats second = g[r].stats();
        EXPECT_TRUE(second.parked) << "rank " << r;
        EXPECT_EQ(second.progress_passes, first.progress_passes) << "rank " << r;
    }
}

}  // namespace
}  // namespace mooncake::pg
