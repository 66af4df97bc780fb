// P2PEngine with external pools (P2POptions::external_pools, p2p_mover.h):
// data moves by queued copies that complete later, as on a GPU. Checks that
// bytes arrive exactly, that a send completes only once its data has landed,
// that no operation completes while a copy into or out of its buffer is
// still queued, and that the engine's options and mover must agree.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "tests/cpp/pg/p2p_fake_mover.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg {
namespace {

using namespace p2p_test;
using namespace std::chrono_literals;

TEST(P2PExternalPools, ByteExactWhicheverSidePostsFirst) {
    MoverGroup g(2, externalOptions());
    for (bool recv_first : {true, false}) {
        for (size_t bytes : kSizes) {
            SCOPED_TRACE("bytes=" + std::to_string(bytes) +
                         " recv_first=" + std::to_string(recv_first));
            auto want = pattern(bytes, static_cast<int>(bytes % 7));
            std::vector<uint8_t> got(bytes, 0xee);
            std::shared_ptr<Completion> r, s;
            if (recv_first) {
                r = postRecv(g[0], got, 1, 5);
                s = postSend(g[1], want, 0, 5);
            } else {
                s = postSend(g[1], want, 0, 5);
                r = postRecv(g[0], got, 1, 5);
            }
            ASSERT_TRUE(r->wait().ok());
            ASSERT_TRUE(s->wait().ok());
            EXPECT_EQ(got, want);
        }
    }
    // Nothing went through the window's pools: every data byte was copied
    // by a mover, into the pool and out of it.
    EXPECT_GT(g.movers[1]->ran(), 0u);
    EXPECT_EQ(g.movers[0]->ran(), g.movers[1]->ran());
}

TEST(P2PExternalPools, ManyRanksTagsAndMessagesLargerThanThePool) {
    constexpr int kRanks = 3;
    MoverGroup g(kRanks, externalOptions());
    const std::vector<size_t> sizes = {10000, 0, 5000, 4096, 1};  // by tag
    std::vector<std::vector<std::vector<uint8_t>>> got(kRanks);
    runRanks(kRanks, [&](int rank) {
        const int to = (rank + 1) % kRanks;
        const int from = (rank + kRanks - 1) % kRanks;
        std::vector<std::vector<uint8_t>> want;
        for (size_t tag = 0; tag < sizes.size(); ++tag)
            want.push_back(pattern(sizes[tag], rank * 10 + static_cast<int>(tag)));
        got[rank].resize(sizes.size());
        std::vector<std::shared_ptr<Completion>> ops;
        // Sends in tag order, recvs in reverse: matching is per tag.
        for (size_t tag = 0; tag < sizes.size(); ++tag)
            ops.push_back(postSend(g[rank], want[tag], to, static_cast<int>(tag)));
        for (size_t i = sizes.size(); i-- > 0;) {
            got[rank][i].assign(sizes[i], 0);
            ops.push_back(postRecv(g[rank], got[rank][i], from, static_cast<int>(i)));
        }
        for (auto& op : ops)
            EXPECT_TRUE(op->wait().ok());
    });
    for (int rank = 0; rank < kRanks; ++rank) {
        const int from = (rank + kRanks - 1) % kRanks;
        for (size_t tag = 0; tag < sizes.size(); ++tag)
            EXPECT_EQ(got[rank][tag], pattern(sizes[tag], from * 10 + static_cast<int>(tag)));
    }
}

TEST(P2PExternalPools, ASendCompletesOnlyOnceItsDataHasLanded) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 4);  // three chunks, all credited at once
    std::vector<uint8_t> got(want.size(), 0);
    g.movers[1]->hold();
    auto r = postRecv(g[0], got, 1, 1);
    auto s = postSend(g[1], want, 0, 1);
    ASSERT_TRUE(eventually([&] { return g.movers[1]->queued() == 3; }));
    // The puts are queued, not run: the send still owns its buffer and the
    // receiver has no ack to act on.
    EXPECT_FALSE(s->done());
    EXPECT_FALSE(r->done());
    g.movers[1]->release();
    ASSERT_TRUE(s->wait().ok());
    ASSERT_TRUE(r->wait().ok());
    EXPECT_EQ(got, want);
}

TEST(P2PExternalPools, TheSendBufferIsTheCallersOnceTheSendCompletes) {
    MoverGroup g(2, externalOptions());
    const auto original = pattern(3001, 5);
    auto buffer = original;
    std::vector<uint8_t> got(buffer.size(), 0);
    // The receiver's copies out of its pool wait; the sender's puts run.
    g.movers[0]->hold();
    auto r = postRecv(g[0], got, 1, 2);
    auto s = postSend(g[1], buffer, 0, 2);
    ASSERT_TRUE(s->wait().ok());
    std::fill(buffer.begin(), buffer.end(), 0);
    g.movers[0]->release();
    ASSERT_TRUE(r->wait().ok());
    EXPECT_EQ(got, original);
}

TEST(P2PExternalPools, AFailedRecvCompletesOnlyAfterTheCopiesIntoItsBuffer) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 6);
    std::vector<uint8_t> got(want.size(), 0);
    g.movers[0]->hold();
    auto c = Completion::make();
    std::atomic<uint64_t> ran_at_completion{~uint64_t{0}};
    auto record = Completion::callback(c);
    ASSERT_TRUE(g[0].recv(got.data(), got.size(), 1, 3, Deadline::after(20s),
                          [&, record](Status st) {
                              ran_at_completion = g.movers[0]->ran();
                              record(std::move(st));
                          })
                    .ok());
    auto s = postSend(g[1], want, 0, 3);
    ASSERT_TRUE(s->wait().ok());
    ASSERT_TRUE(eventually([&] { return g.movers[0]->queued() == 3; }));
    // Rank 1 leaves rank 0's view while the copies into the recv's buffer
    // are queued: the engine drains them before it fails the recv.
    std::thread leave([&] { EXPECT_TRUE(g[0].setMembership({1, 0}, {0, 0}).ok()); });
    ASSERT_TRUE(eventually([&] { return g.movers[0]->drains() > 0; }));
    EXPECT_FALSE(c->done());
    g.movers[0]->release();
    leave.join();
    Status st = c->wait();
    EXPECT_EQ(st.code(), StatusCode::kPeerFailure) << st.toString();
    EXPECT_EQ(ran_at_completion.load(), 3u);
}

// Copies queued for longer than the stall grace (2 s) and still not done at
// their op's deadline (a stalled queue) fail the pair rather than leave the
// op waiting: the engine drains (here the drain is let through), then fails
// the recv with its own timeout.
TEST(P2PExternalPools, CopiesQueuedPastTheDeadlineFailThePair) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 10);
    std::vector<uint8_t> got(want.size(), 0);
    g.movers[0]->hold();
    auto r = postRecv(g[0], got, 1, 8, Deadline::after(500ms));
    auto s = postSend(g[1], want, 0, 8);
    ASSERT_TRUE(s->wait().ok());
    ASSERT_TRUE(eventually([&] { return g.movers[0]->drains() > 0; }));
    EXPECT_FALSE(r->done());
    g.movers[0]->release();
    Status st = r->wait();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("got 0 of 3 chunks"), std::string::npos) << st.toString();
    // The pair failed: a new send to rank 0 is refused until its epoch moves.
    auto again = pattern(10, 1);
    auto s2 = Completion::make();
    Status refused =
        g[1].send(again.data(), again.size(), 0, 8, Deadline::after(1s), Completion::callback(s2));
    Status posted_on_0 = g[0].recv(got.data(), 10, 1, 8, Deadline::after(1s), [](Status) {});
    EXPECT_EQ(posted_on_0.code(), StatusCode::kTimeout) << posted_on_0.toString();
    EXPECT_NE(posted_on_0.message().find("still queued"), std::string::npos)
        << posted_on_0.toString();
    if (refused.ok())
        (void)s2->wait();
}

// A deadline that passes while the op's copies are queued (within the stall
// grace) fails that op alone, once its copies are done: the pair goes on.
TEST(P2PExternalPools, ADeadlinePassingWhileCopiesRunFailsOnlyThatOp) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 15);
    std::vector<uint8_t> got(want.size(), 0);
    g.movers[0]->hold();
    const Deadline deadline = Deadline::after(300ms);
    auto r = postRecv(g[0], got, 1, 13, deadline);
    auto s = postSend(g[1], want, 0, 13);
    ASSERT_TRUE(s->wait().ok());
    ASSERT_TRUE(eventually([&] { return g.movers[0]->queued() == 3; }));
    ASSERT_TRUE(eventually([&] { return deadline.expired(); }));
    // Two passes of the progress thread after the deadline: it has seen it.
    const uint64_t passes = g[0].stats().progress_passes;
    ASSERT_TRUE(eventually([&] { return g[0].stats().progress_passes >= passes + 2; }));
    EXPECT_FALSE(r->done());  // its copies still write its buffer
    g.movers[0]->release();
    Status st = r->wait();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_EQ(g.movers[0]->drains(), 0);
    expectDelivered(g, 1, 0, 13, 5000, 16);
}

// A queue that never drains still ends the op, after the drain's bound
// (5 s), instead of a hang.
TEST(P2PExternalPools, AQueueThatNeverDrainsStillEndsTheOp) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 11);
    std::vector<uint8_t> got(want.size(), 0);
    g.movers[0]->hold();
    const auto t0 = std::chrono::steady_clock::now();
    auto r = postRecv(g[0], got, 1, 9, Deadline::after(300ms));
    auto s = postSend(g[1], want, 0, 9);
    Status st = r->wait(20s);
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
    EXPECT_TRUE(s->wait().ok());
    // The copies the engine gave up on still write `got` once they run:
    // let them finish before it goes.
    g.movers[0]->release();
    EXPECT_TRUE(eventually([&] { return g.movers[0]->ran() == g.movers[0]->queued(); }));
}

TEST(P2PExternalPools, EveryCopyCarriesItsOperationsOrder) {
    MoverGroup g(2, externalOptions());
    struct Tagged : P2POrder {};
    auto send_order = std::make_shared<const Tagged>();
    auto recv_order = std::make_shared<const Tagged>();
    auto want = pattern(3001, 12);
    std::vector<uint8_t> got(want.size(), 0);
    auto r = Completion::make();
    auto s = Completion::make();
    ASSERT_TRUE(g[0].recv(got.data(), got.size(), 1, 10, Deadline::after(20s),
                          Completion::callback(r), recv_order)
                    .ok());
    ASSERT_TRUE(g[1].send(want.data(), want.size(), 0, 10, Deadline::after(20s),
                          Completion::callback(s), send_order)
                    .ok());
    ASSERT_TRUE(r->wait().ok());
    ASSERT_TRUE(s->wait().ok());
    EXPECT_EQ(got, want);
    EXPECT_EQ(g.movers[1]->orders(), std::vector<const P2POrder*>(3, send_order.get()));
    EXPECT_EQ(g.movers[0]->orders(), std::vector<const P2POrder*>(3, recv_order.get()));
}

// An op whose order is not ready (its producer, or its buffer's last
// reader, still running) holds back its own copies only: later ops of the
// pair, on both sides, go ahead. A recv that is not ready is granted no
// pool space, so even one the size of the whole pool holds none of it.
TEST(P2PExternalPools, AnOpWhoseOrderIsNotReadyHoldsBackOnlyItsOwnCopies) {
    MoverGroup g(2, externalOptions());
    for (bool gate_the_send : {true, false}) {
        SCOPED_TRACE(gate_the_send ? "send gated" : "recv gated");
        auto gate = std::make_shared<Gate>();
        auto a = pattern(gate_the_send ? 3001 : 4096, 13), b = pattern(2500, 14);
        std::vector<uint8_t> got_a(a.size(), 0), got_b(b.size(), 0);
        auto ra = Completion::make(), sa = Completion::make();
        ASSERT_TRUE(g[0].recv(got_a.data(), got_a.size(), 1, 11, Deadline::after(20s),
                              Completion::callback(ra),
                              gate_the_send ? nullptr : std::shared_ptr<const P2POrder>(gate))
                        .ok());
        ASSERT_TRUE(g[1].send(a.data(), a.size(), 0, 11, Deadline::after(20s),
                              Completion::callback(sa),
                              gate_the_send ? std::shared_ptr<const P2POrder>(gate) : nullptr)
                        .ok());
        auto rb = postRecv(g[0], got_b, 1, 12);
        auto sb = postSend(g[1], b, 0, 12);
        ASSERT_TRUE(rb->wait().ok());
        ASSERT_TRUE(sb->wait().ok());
        EXPECT_EQ(got_b, b);
        EXPECT_FALSE(ra->done());
        EXPECT_FALSE(sa->done());
        gate->open = true;
        ASSERT_TRUE(ra->wait().ok());
        ASSERT_TRUE(sa->wait().ok());
        EXPECT_EQ(got_a, a);
    }
}

// A send whose data never becomes ready times out saying so, and its
// receiver, whose credits it holds, is told at once (abandoned), not at its
// own deadline.
TEST(P2PExternalPools, ASendWhoseDataNeverBecomesReadyAbandonsItsRecvAtOnce) {
    MoverGroup g(2, externalOptions());
    auto gate = std::make_shared<Gate>();
    auto want = pattern(3001, 17);
    std::vector<uint8_t> got(want.size(), 0);
    auto r = postRecv(g[0], got, 1, 14, Deadline::after(20s));
    auto s = Completion::make();
    ASSERT_TRUE(g[1].send(want.data(), want.size(), 0, 14, Deadline::after(300ms),
                          Completion::callback(s), gate)
                    .ok());
    Status ss = s->wait();
    EXPECT_EQ(ss.code(), StatusCode::kTimeout) << ss.toString();
    EXPECT_NE(ss.message().find("never became ready"), std::string::npos) << ss.toString();
    Status rs = r->wait(5s);
    EXPECT_EQ(rs.code(), StatusCode::kAborted) << rs.toString();
    EXPECT_NE(rs.message().find("gave up on its send"), std::string::npos) << rs.toString();
    expectDelivered(g, 1, 0, 14, 3001, 18);
}

TEST(P2PExternalPools, AnUnmatchedSendTimesOutNamingTheChunksPut) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 7);
    Status st = postSend(g[1], want, 0, 4, Deadline::after(300ms))->wait();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("put 0 of 3 chunks"), std::string::npos) << st.toString();
    // The pair stays usable.
    expectDelivered(g, 1, 0, 4, 3001, 8);
}

TEST(P2PExternalPools, SizeMismatchFailsBothSides) {
    MoverGroup g(2, externalOptions());
    expectSizeMismatchFailsBothSides(g);
}

TEST(P2PExternalPools, AMoverThatCannotCompleteFailsThePair) {
    MoverGroup g(2, externalOptions());
    auto want = pattern(3001, 8);
    std::vector<uint8_t> got(want.size(), 0);
    g.movers[1]->hold();
    auto r = postRecv(g[0], got, 1, 6, Deadline::after(2s));
    auto s = postSend(g[1], want, 0, 6);
    ASSERT_TRUE(eventually([&] { return g.movers[1]->queued() == 3; }));
    g.movers[1]->breakQueue();
    g.movers[1]->release();
    Status ss = s->wait();
    EXPECT_FALSE(ss.ok());
    EXPECT_NE(ss.message().find("fake mover"), std::string::npos) << ss.toString();
    // No ack ever reaches the receiver: its recv ends at its deadline.
    EXPECT_EQ(r->wait().code(), StatusCode::kTimeout);
}

TEST(P2PExternalPools, AnySourceRecvTakesTheSenderByteExact) {
    MoverGroup g(3, externalOptions());
    auto want = pattern(5000, 9);
    std::vector<uint8_t> got(want.size(), 0);
    auto c = std::make_shared<Completion>();
    std::atomic<int> source{-1};
    auto record = Completion::callback(c);
    ASSERT_TRUE(g[0].recvAny(got.data(), got.size(), 7, Deadline::after(20s),
                             [&, record](Status st, int from) {
                                 source = from;
                                 record(std::move(st));
                             })
                    .ok());
    auto s = postSend(g[2], want, 0, 7);
    ASSERT_TRUE(c->wait().ok());
    ASSERT_TRUE(s->wait().ok());
    EXPECT_EQ(source.load(), 2);
    EXPECT_EQ(got, want);
}

TEST(P2PExternalPools, TheWindowHoldsOnlyTheRings) {
    const P2POptions in_window = smallOptions();
    const P2POptions external = externalOptions();
    for (int n : {2, 5}) {
        EXPECT_EQ(P2PEngine::windowBytesFor(n, in_window) - P2PEngine::windowBytesFor(n, external),
                  static_cast<size_t>(n) * 2 * in_window.pool_bytes_per_peer);
    }
}

TEST(P2PExternalPools, OptionsAndMoverMustAgree) {
    const P2POptions external = externalOptions();
    ThreadFabricGroup fabrics(
        2, external.window_offset + P2PEngine::windowBytesFor(2, smallOptions()));
    auto want = pattern(10, 1);
    {
        P2PEngine without_mover(fabrics.fabric(0), external);
        Status st =
            without_mover.send(want.data(), want.size(), 1, 0, Deadline::after(1s), [](Status) {});
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(st.message().find("external_pools needs a P2PMover"), std::string::npos)
            << st.toString();
    }
    {
        auto pools = std::make_shared<FakePools>(2, external.pool_bytes_per_peer);
        P2PEngine mover_without_option(fabrics.fabric(1), smallOptions(),
                                       std::make_shared<FakeMover>(pools, 1));
        Status st = mover_without_option.send(want.data(), want.size(), 0, 0, Deadline::after(1s),
                                              [](Status) {});
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(st.message().find("a P2PMover needs external_pools"), std::string::npos)
            << st.toString();
    }
}

}  // namespace
}  // namespace mooncake::pg
