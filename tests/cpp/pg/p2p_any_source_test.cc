// P2PEngine::recvAny over ThreadFabricGroup: the sender's rank and bytes come
// back exactly, racing senders each land in exactly one recv, per-sender
// order holds against tagged recvs, and timeouts, size mismatches and dead
// peers leave the pairs usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg {
namespace {

using namespace p2p_test;
using namespace std::chrono_literals;

// One any-source completion: its status and source.
class AnyCompletion {
public:
    static std::shared_ptr<AnyCompletion> make() { return std::make_shared<AnyCompletion>(); }

    static P2PEngine::AnyCallback callback(const std::shared_ptr<AnyCompletion>& c) {
        return [c](Status s, int source) {
            std::lock_guard<std::mutex> lock(c->mu_);
            EXPECT_FALSE(c->status_.has_value()) << "callback fired twice";
            c->status_ = std::move(s);
            c->source_ = source;
            c->cv_.notify_all();
        };
    }

    // The status (Internal after `limit`: a hang) and the source.
    std::pair<Status, int> wait(std::chrono::milliseconds limit = 20s) {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_for(lock, limit, [this] { return status_.has_value(); }))
            return {Internal("no completion within " + std::to_string(limit.count()) + " ms"), -2};
        return {*status_, source_};
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<Status> status_;
    int source_ = -2;
};

std::shared_ptr<AnyCompletion> postAny(P2PEngine& e, std::vector<uint8_t>& buf, int tag,
                                       Deadline d = Deadline::after(20s)) {
    auto c = AnyCompletion::make();
    auto done = AnyCompletion::callback(c);
    Status st = e.recvAny(buf.data(), buf.size(), tag, d, done);
    EXPECT_TRUE(st.ok()) << st.toString();
    if (!st.ok())
        done(st, -1);
    return c;
}

TEST(P2PAnySource, TakesTheOnlySenderByteExact) {
    Group g(3, smallOptions());
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1025}, size_t{3 * 4096 + 17}}) {
        SCOPED_TRACE("bytes=" + std::to_string(bytes));
        for (int sender : {2, 1}) {
            auto want = pattern(bytes, sender);
            std::vector<uint8_t> got(bytes, 0xee);
            auto r = postAny(g[0], got, 4);
            auto s = postSend(g[sender], want, 0, 4);
            auto [st, source] = r->wait();
            ASSERT_TRUE(st.ok()) << st.toString();
            EXPECT_EQ(source, sender);
            EXPECT_TRUE(s->wait().ok());
            EXPECT_EQ(got, want);
        }
    }
}

TEST(P2PAnySource, RacingSendersEachLandInExactlyOneRecv) {
    constexpr int kRanks = 4;
    constexpr size_t kBytes = 2500;  // several chunks
    Group g(kRanks, smallOptions());
    for (int round = 0; round < 30; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        std::vector<std::vector<uint8_t>> got(kRanks - 1, std::vector<uint8_t>(kBytes, 0xee));
        std::vector<std::shared_ptr<AnyCompletion>> recvs;
        // One recv first, so the senders race for it; the rest after.
        recvs.push_back(postAny(g[0], got[0], 7));
        std::vector<std::vector<uint8_t>> payloads;
        for (int r = 1; r < kRanks; ++r)
            payloads.push_back(pattern(kBytes, r * 100 + round));
        std::vector<std::shared_ptr<Completion>> sends;
        for (int r = 1; r < kRanks; ++r)
            sends.push_back(postSend(g[r], payloads[r - 1], 0, 7));
        auto first = recvs[0]->wait();
        ASSERT_TRUE(first.first.ok()) << first.first.toString();
        for (int i = 1; i < kRanks - 1; ++i)
            recvs.push_back(postAny(g[0], got[i], 7));
        std::set<int> sources;
        for (int i = 0; i < kRanks - 1; ++i) {
            auto [st, source] = recvs[i]->wait();
            ASSERT_TRUE(st.ok()) << st.toString();
            ASSERT_GE(source, 1);
            ASSERT_LT(source, kRanks);
            EXPECT_EQ(got[i], payloads[source - 1]) << "recv " << i << " from rank " << source;
            sources.insert(source);
        }
        EXPECT_EQ(sources, (std::set<int>{1, 2, 3}));
        for (auto& s : sends)
            EXPECT_TRUE(s->wait().ok());
    }
}

TEST(P2PAnySource, KeepsPostingOrderWithTaggedRecvs) {
    Group g(2, smallOptions());
    // tagged A, any-source B, tagged C on one tag: messages 1, 2, 3 in order.
    std::vector<std::vector<uint8_t>> got(3, std::vector<uint8_t>(1500, 0));
    auto a = postRecv(g[0], got[0], 1, 5);
    auto b = postAny(g[0], got[1], 5);
    auto c = postRecv(g[0], got[2], 1, 5);
    std::vector<std::vector<uint8_t>> msgs = {pattern(1500, 1), pattern(1500, 2), pattern(1500, 3)};
    for (auto& m : msgs)
        EXPECT_TRUE(postSend(g[1], m, 0, 5)->wait().ok());
    EXPECT_TRUE(a->wait().ok());
    auto [st, source] = b->wait();
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(source, 1);
    EXPECT_TRUE(c->wait().ok());
    EXPECT_EQ(got, msgs);
}

TEST(P2PAnySource, PerSenderOrderHoldsWhicheverSenderWins) {
    Group g(3, smallOptions());
    for (int round = 0; round < 20; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        const int tag = 100 + round;
        // Rank 1 sends m1, m2; rank 2 sends n1. Rank 0: any X, from-1 Y, any Z.
        auto m1 = pattern(900, 10 + round), m2 = pattern(900, 20 + round);
        auto n1 = pattern(900, 30 + round);
        std::vector<uint8_t> x(900), y(900), z(900);
        auto rx = postAny(g[0], x, tag);
        auto ry = postRecv(g[0], y, 1, tag);
        auto s2 = postSend(g[2], n1, 0, tag);
        auto s1a = postSend(g[1], m1, 0, tag);
        auto s1b = postSend(g[1], m2, 0, tag);
        auto [xs, xsrc] = rx->wait();
        ASSERT_TRUE(xs.ok()) << xs.toString();
        ASSERT_TRUE(ry->wait().ok());
        auto rz = postAny(g[0], z, tag);
        auto [zs, zsrc] = rz->wait();
        ASSERT_TRUE(zs.ok()) << zs.toString();
        if (xsrc == 1) {
            EXPECT_EQ(x, m1);
            EXPECT_EQ(y, m2);
            EXPECT_EQ(zsrc, 2);
            EXPECT_EQ(z, n1);
        } else {
            EXPECT_EQ(xsrc, 2);
            EXPECT_EQ(x, n1);
            EXPECT_EQ(y, m1);
            EXPECT_EQ(zsrc, 1);
            EXPECT_EQ(z, m2);
        }
        for (auto& s : {s2, s1a, s1b})
            EXPECT_TRUE(s->wait().ok());
    }
}

TEST(P2PAnySource, TimeoutWithdrawsTheReservations) {
    Group g(3, smallOptions());
    std::vector<uint8_t> got(700);
    auto r = postAny(g[0], got, 3, Deadline::after(200ms));
    auto [st, source] = r->wait();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_EQ(source, -1);
    // The withdrawn reservations bind nothing: later messages on the tag go
    // to later recvs, in order, from both peers.
    for (int round = 0; round < 6; ++round) {
        expectDelivered(g, 1, 0, 3, 700, round);
        expectDelivered(g, 2, 0, 3, 3000, round);
    }
}

TEST(P2PAnySource, OfferedMessageGoesToTheNextRecvWhenAnotherSenderWins) {
    Group g(3, smallOptions());
    // Rank 2's message is staged (offered) before the recv is posted; rank
    // 1's arrives too. Whichever wins, the loser's message is not lost.
    auto m1 = pattern(1200, 1), m2 = pattern(1200, 2);
    auto s1 = postSend(g[1], m1, 0, 9);
    auto s2 = postSend(g[2], m2, 0, 9);
    EXPECT_TRUE(s1->wait().ok());
    EXPECT_TRUE(s2->wait().ok());
    std::vector<uint8_t> a(1200), b(1200);
    auto ra = postAny(g[0], a, 9);
    auto [as, asrc] = ra->wait();
    ASSERT_TRUE(as.ok()) << as.toString();
    const int other = asrc == 1 ? 2 : 1;
    ASSERT_TRUE(postRecv(g[0], b, other, 9)->wait().ok());
    EXPECT_EQ(a, asrc == 1 ? m1 : m2);
    EXPECT_EQ(b, other == 1 ? m1 : m2);
}

TEST(P2PAnySource, SizeMismatchFailsTheRecvAndKeepsThePair) {
    Group g(2, smallOptions());
    std::vector<uint8_t> got(100);
    auto r = postAny(g[0], got, 2);
    auto small = pattern(50, 1);
    postSend(g[1], small, 0, 2);
    auto [st, source] = r->wait();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_EQ(source, 1);
    expectDelivered(g, 1, 0, 2, 100, 3);
}

TEST(P2PAnySource, ManyPendingRecvsStayWithinTheRing) {
    // ring_slots = 4: a reservation holds two slots, so at most two are
    // written per peer at a time; the rest wait and nothing wedges.
    Group g(2, smallOptions());
    constexpr int kRecvs = 8;
    std::vector<std::vector<uint8_t>> got(kRecvs, std::vector<uint8_t>(300, 0));
    std::vector<std::shared_ptr<AnyCompletion>> recvs;
    for (int i = 0; i < kRecvs; ++i)
        recvs.push_back(postAny(g[0], got[i], 40 + i));
    std::vector<std::vector<uint8_t>> msgs;
    for (int i = 0; i < kRecvs; ++i)
        msgs.push_back(pattern(300, i));
    // Not in tag order, but within the sender's 4-chunk pool: a send
    // completes once staged, and the pool frees as reservations are met.
    std::vector<std::shared_ptr<Completion>> sends;
    for (int i : {2, 1, 0, 3, 4, 5, 6, 7})
        sends.push_back(postSend(g[1], msgs[i], 0, 40 + i));
    for (auto& s : sends)
        EXPECT_TRUE(s->wait().ok());
    for (int i = 0; i < kRecvs; ++i) {
        auto [st, source] = recvs[i]->wait();
        ASSERT_TRUE(st.ok()) << "recv " << i << ": " << st.toString();
        EXPECT_EQ(source, 1);
        EXPECT_EQ(got[i], msgs[i]);
    }
    // Tagged traffic still flows on the pair.
    expectDelivered(g, 1, 0, 40, 3000, 9);
}

TEST(P2PAnySource, DeadPeerLeavesTheOthersAndLastOneFails) {
    Group g(3, smallOptions());
    std::vector<uint8_t> got(500);
    auto r = postAny(g[0], got, 1, Deadline::after(30s));
    g.fabrics.kill(2);
    auto want = pattern(500, 7);
    EXPECT_TRUE(postSend(g[1], want, 0, 1)->wait().ok());
    auto [st, source] = r->wait();
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(source, 1);
    EXPECT_EQ(got, want);
    // With every candidate gone the recv fails instead of waiting.
    auto r2 = postAny(g[0], got, 1, Deadline::after(30s));
    g.fabrics.kill(1);
    auto [st2, source2] = r2->wait();
    EXPECT_EQ(st2.code(), StatusCode::kPeerFailure) << st2.toString();
    EXPECT_EQ(source2, -1);
}

TEST(P2PAnySource, NoOtherActiveMemberIsRefused) {
    Group g(2, smallOptions());
    ASSERT_TRUE(g[0].setEpoch(1, {1, 0}).ok());
    std::vector<uint8_t> got(8);
    Status st = g[0].recvAny(got.data(), got.size(), 0, Deadline::after(1s), [](Status, int) {});
    EXPECT_EQ(st.code(), StatusCode::kPeerFailure) << st.toString();
}

}  // namespace
}  // namespace mooncake::pg
