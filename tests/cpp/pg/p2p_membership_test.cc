// P2PEngine::setMembership: a membership change restarts only the pairs whose
// pair epoch (the later activation epoch of the two ranks) changed. Pending
// operations and staged data of every other pair survive it byte-exact,
// whichever intermediate views a rank skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/core/pair_epoch.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg {
namespace {

using namespace p2p_test;
using namespace std::chrono_literals;

// One committed view: which slots are Active, and each one's active_since.
struct View {
    std::vector<uint8_t> active;
    std::vector<uint64_t> since;
};

// What the elastic backend passes for rank `self`: its pairEpochs, whose
// values PairEpochRule below pins down.
Status apply(P2PEngine& e, int self, const View& v) {
    return e.setMembership(v.active,
                           pairEpochs(static_cast<uint32_t>(self), v.since, v.since.size()));
}

// The rule written out: a pair restarts when either of its ranks was
// (re)activated, so its epoch is the later of the two activations; ranks that
// are not Active (since 0) and slots past the view count as never activated.
TEST(P2PMembership, PairEpochRule) {
    const std::vector<uint64_t> since = {1, 1, 2, 0, 5};
    const std::vector<std::vector<uint64_t>> want = {
        {1, 1, 2, 1, 5, 1},  // rank 0, activated at epoch 1
        {1, 1, 2, 1, 5, 1},  // rank 1
        {2, 2, 2, 2, 5, 2},  // rank 2, joined at epoch 2
        {1, 1, 2, 0, 5, 0},  // rank 3, not Active
        {5, 5, 5, 5, 5, 5},  // rank 4, reactivated at epoch 5
        {1, 1, 2, 0, 5, 0},  // slot 5, outside the view
    };
    for (uint32_t self = 0; self < want.size(); ++self)
        EXPECT_EQ(pairEpochs(self, since, 6), want[self]) << "rank " << self;
}

void applyAll(Group& g, const View& v) {
    for (int r = 0; r < static_cast<int>(g.engines.size()); ++r)
        ASSERT_TRUE(apply(g[r], r, v).ok()) << "rank " << r;
}

// Rank 0's whole receive pool for rank 1 (smallOptions: 4096 bytes) is
// granted to a recv on tag 9, so later recvs from rank 1 get no credit until
// rank 1 sends on tag 9: a matched send and recv stay pending meanwhile.
constexpr int kGateTag = 9;
constexpr size_t kGateBytes = 4096;

TEST(P2PMembership, UnchangedPairEpochKeepsPendingAndStagedOps) {
    Group g(3, smallOptions());
    const View founders{{1, 1, 0}, {1, 1, 0}};
    applyAll(g, founders);

    auto gate_want = pattern(kGateBytes, 9);
    std::vector<uint8_t> gate_got(kGateBytes);
    // Credits go to recvs in posting order, so the gate gets the pool first.
    auto gate_recv = postRecv(g[0], gate_got, 1, kGateTag);
    // Matched (posted on both sides) but blocked behind the gate.
    // One chunk each of rank 1's 4-chunk send pool, which leaves room to
    // stage the gate's message later.
    auto matched_want = pattern(1000, 5);
    std::vector<uint8_t> matched_got(1000);
    auto matched_recv = postRecv(g[0], matched_got, 1, 5);
    auto matched_send = postSend(g[1], matched_want, 0, 5);
    // Staged on rank 1; its recv is posted only after the change.
    auto staged_want = pattern(900, 6);
    auto staged_send = postSend(g[1], staged_want, 0, 6);
    ASSERT_TRUE(matched_send->wait().ok());
    ASSERT_TRUE(staged_send->wait().ok());

    // Rank 2 joins at epoch 2; the pair (0, 1) keeps pair epoch 1.
    const View joined{{1, 1, 1}, {1, 1, 2}};
    applyAll(g, joined);
    EXPECT_FALSE(matched_recv->done());
    EXPECT_FALSE(gate_recv->done());

    auto gate_send = postSend(g[1], gate_want, 0, kGateTag);
    ASSERT_TRUE(gate_recv->wait().ok());
    ASSERT_TRUE(matched_recv->wait().ok());
    std::vector<uint8_t> staged_got(900);
    ASSERT_TRUE(postRecv(g[0], staged_got, 1, 6)->wait().ok());
    EXPECT_TRUE(gate_send->wait().ok());
    EXPECT_EQ(gate_got, gate_want);
    EXPECT_EQ(matched_got, matched_want);
    EXPECT_EQ(staged_got, staged_want);

    // The joiner's pairs started in pair epoch 2 on both sides.
    expectDelivered(g, 0, 2, 0, 5000, 2);
}

TEST(P2PMembership, ChangedPairEpochAbortsOnlyThatPair) {
    Group g(3, smallOptions());
    applyAll(g, View{{1, 1, 1}, {1, 1, 1}});

    std::vector<uint8_t> from1(100), from2(2000), at2(100);
    auto recv01 = postRecv(g[0], from1, 1, 1);
    auto recv02 = postRecv(g[0], from2, 2, 1);
    auto recv21 = postRecv(g[2], at2, 1, 1);
    // Staged on rank 1 for rank 0 in the old pair epoch: dropped by the
    // restart, so a recv after it gets the new epoch's message instead.
    auto old_data = pattern(700, 30);
    ASSERT_TRUE(postSend(g[1], old_data, 0, 3)->wait().ok());
    // Staged on rank 2 for rank 0: its pair does not change.
    auto kept = pattern(1500, 20);
    ASSERT_TRUE(postSend(g[2], kept, 0, 2)->wait().ok());

    // Rank 1 is replaced and activated again at epoch 3.
    applyAll(g, View{{1, 1, 1}, {1, 3, 1}});
    EXPECT_EQ(recv01->wait().code(), StatusCode::kAborted);
    EXPECT_EQ(recv21->wait().code(), StatusCode::kAborted);
    EXPECT_FALSE(recv02->done());

    auto want02 = pattern(2000, 21);
    ASSERT_TRUE(postSend(g[2], want02, 0, 1)->wait().ok());
    ASSERT_TRUE(recv02->wait().ok());
    EXPECT_EQ(from2, want02);
    std::vector<uint8_t> kept_got(1500);
    ASSERT_TRUE(postRecv(g[0], kept_got, 2, 2)->wait().ok());
    EXPECT_EQ(kept_got, kept);

    expectDelivered(g, 1, 0, 3, 700, 31);
}

TEST(P2PMembership, InactivePeerFailsWithPeerFailure) {
    Group g(3, smallOptions());
    applyAll(g, View{{1, 1, 1}, {1, 1, 1}});
    std::vector<uint8_t> from1(3000), from2(10), at2(10);
    auto recv01 = postRecv(g[0], from1, 1, 0);
    auto recv02 = postRecv(g[0], from2, 2, 0);
    auto recv20 = postRecv(g[2], at2, 0, 0);

    applyAll(g, View{{1, 1, 0}, {1, 1, 0}});
    EXPECT_EQ(recv02->wait().code(), StatusCode::kPeerFailure);
    // Rank 2's own side: it is no longer a member, so nothing it posts can
    // be served.
    EXPECT_EQ(recv20->wait().code(), StatusCode::kAborted);
    auto noop = [](Status) { ADD_FAILURE() << "callback of a rejected op"; };
    EXPECT_EQ(g[0].send(from2.data(), 10, 2, 0, Deadline::after(1s), noop).code(),
              StatusCode::kPeerFailure);
    EXPECT_EQ(g[2].send(at2.data(), 10, 0, 0, Deadline::after(1s), noop).code(),
              StatusCode::kUnavailable);

    EXPECT_FALSE(recv01->done());
    auto want = pattern(3000, 1);
    auto s = postSend(g[1], want, 0, 0);
    ASSERT_TRUE(recv01->wait().ok());
    EXPECT_TRUE(s->wait().ok());
    EXPECT_EQ(from1, want);
}

// Rank 0 applies every view, rank 1 only the last one: both must end in the
// same pair epoch with fresh sequences, and pairs that never changed keep
// their pending operations on both sides.
TEST(P2PMembership, SkippedViewsDecideAlike) {
    Group g(3, smallOptions());
    applyAll(g, View{{1, 1, 1}, {1, 1, 1}});
    std::vector<uint8_t> got01(1200);
    auto recv01 = postRecv(g[0], got01, 1, 4);

    const View v2{{1, 1, 0}, {1, 1, 0}};  // rank 2 deactivated
    const View v3{{1, 1, 1}, {1, 1, 3}};  // and activated again
    ASSERT_TRUE(apply(g[0], 0, v2).ok());
    ASSERT_TRUE(apply(g[2], 2, v2).ok());
    ASSERT_TRUE(apply(g[0], 0, v3).ok());
    ASSERT_TRUE(apply(g[2], 2, v3).ok());
    ASSERT_TRUE(apply(g[1], 1, v3).ok());  // skipped v2
    EXPECT_FALSE(recv01->done());
    auto want01 = pattern(1200, 4);
    ASSERT_TRUE(postSend(g[1], want01, 0, 4)->wait().ok());
    ASSERT_TRUE(recv01->wait().ok());
    EXPECT_EQ(got01, want01);
    for (auto [a, b] : {std::pair{1, 2}, std::pair{2, 0}}) {
        SCOPED_TRACE(std::to_string(a) + " -> " + std::to_string(b));
        expectDelivered(g, a, b, 8, 2100, a * 3 + b);
    }

    // A failure resync restarts every Active member at epoch 4, then rank 2
    // leaves at 5. Rank 1 sees only view 5; pair (0, 1) is 4 for both.
    const View v4{{1, 1, 1}, {4, 4, 4}};
    const View v5{{1, 1, 0}, {4, 4, 0}};
    ASSERT_TRUE(apply(g[0], 0, v4).ok());
    ASSERT_TRUE(apply(g[0], 0, v5).ok());
    ASSERT_TRUE(apply(g[1], 1, v5).ok());
    expectDelivered(g, 0, 1, 9, 3333, 7);
}

TEST(P2PMembership, PairEpochEqualModulo65536IsRejectedWithoutChange) {
    Group g(2, smallOptions());
    applyAll(g, View{{1, 1}, {1, 1}});
    std::vector<uint8_t> got(64);
    auto r = postRecv(g[0], got, 1, 0);
    Status st = apply(g[0], 0, View{{1, 1}, {1, 65537}});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("65537"), std::string::npos) << st.toString();
    EXPECT_FALSE(r->done());
    auto want = pattern(64, 3);
    ASSERT_TRUE(postSend(g[1], want, 0, 0)->wait().ok());
    ASSERT_TRUE(r->wait().ok());
    EXPECT_EQ(got, want);
    // Sizes must match the group.
    EXPECT_EQ(g[0].setMembership({1, 1, 1}, {1, 1}).code(), StatusCode::kInvalidArgument);
}

// Back in the pair epoch it had before going inactive, a pair cannot restart
// its sequences safely; it stays unusable until its epoch changes.
TEST(P2PMembership, ResumingInTheSamePairEpochKeepsThePairClosed) {
    Group g(2, smallOptions());
    applyAll(g, View{{1, 1}, {1, 1}});
    ASSERT_TRUE(g[0].setMembership({1, 0}, {1, 1}).ok());
    ASSERT_TRUE(g[0].setMembership({1, 1}, {1, 1}).ok());
    std::vector<uint8_t> buf(8);
    auto noop = [](Status) { ADD_FAILURE() << "callback of a rejected op"; };
    EXPECT_EQ(g[0].send(buf.data(), 8, 1, 0, Deadline::after(1s), noop).code(),
              StatusCode::kAborted);
    applyAll(g, View{{1, 1}, {1, 2}});
    expectDelivered(g, 0, 1, 0, 8, 1);
}

// The operations a membership change fails complete on the progress thread
// after setMembership has returned, never inside it: a callback may drop the
// last reference to the caller's owner (a backend applying the view).
TEST(P2PMembership, FailedOpsCompleteOffTheCallersStackAfterItReturns) {
    Group g(3, smallOptions());
    applyAll(g, View{{1, 1, 1}, {1, 1, 1}});
    std::vector<uint8_t> buf(16);
    std::atomic<bool> returned{false};
    auto done = Completion::make();
    std::thread::id ran_on;
    bool ran_after_return = false;
    auto cb = Completion::callback(done);
    ASSERT_TRUE(g[0].recv(buf.data(), buf.size(), 2, 0, Deadline::after(20s),
                          [&, cb](Status s) {
                              ran_on = std::this_thread::get_id();
                              // Inside setMembership this waits in vain.
                              ran_after_return = eventually([&] { return returned.load(); }, 2s);
                              cb(std::move(s));
                          })
                    .ok());
    ASSERT_TRUE(apply(g[0], 0, View{{1, 1, 0}, {1, 1, 0}}).ok());
    returned = true;
    EXPECT_EQ(done->wait().code(), StatusCode::kPeerFailure);
    EXPECT_NE(ran_on, std::this_thread::get_id());
    EXPECT_TRUE(ran_after_return) << "the callback ran inside setMembership";
}

}  // namespace
}  // namespace mooncake::pg

namespace mooncake::pg {
namespace {

// flushSends waits for delivery, not staging: with no recv posted it times
// out naming the undelivered send; once the recv is posted it returns and the
// data is exact.
TEST(P2PFlush, WaitsUntilStagedSendsAreTaken) {
    using namespace std::chrono_literals;
    p2p_test::Group g(2, p2p_test::smallOptions());
    auto want = p2p_test::pattern(3001, 7);
    auto s = p2p_test::postSend(g[1], want, 0, 4, Deadline::after(10s));
    ASSERT_TRUE(s->wait().ok());  // staged
    Status early = g[1].flushSends(Deadline::after(100ms));
    EXPECT_EQ(early.code(), StatusCode::kTimeout) << early.toString();
    EXPECT_NE(early.toString().find("1 send(s) not yet taken"), std::string::npos)
        << early.toString();
    std::vector<uint8_t> got(3001);
    auto r = p2p_test::postRecv(g[0], got, 1, 4);
    ASSERT_TRUE(g[1].flushSends(Deadline::after(10s)).ok());
    ASSERT_TRUE(r->wait().ok());
    EXPECT_EQ(got, want);
    EXPECT_TRUE(g[0].flushSends(Deadline::after(10ms)).ok());  // nothing to flush
}

}  // namespace
}  // namespace mooncake::pg
