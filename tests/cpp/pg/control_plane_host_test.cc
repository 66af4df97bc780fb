// The control-plane hosts end to end: a CoordinatorHost and MemberHosts on
// real threads, talking through KVStore inboxes (InProcessKVStore, and
// FileKVStore across forked processes). Every wait is on a condition with a
// deadline; nothing sleeps to synchronize.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>

#include "tests/cpp/pg/control_plane_host_util.h"

namespace mooncake::pg::control_plane {
namespace {

using namespace host_test;  // NOLINT(build/namespaces): the tests' helpers

// ---- keys and endpoints ----------------------------------------------------

TEST(MailboxTest, KeysAndEndpointEncoding) {
    EXPECT_EQ(coordinatorInboxKey("pg/g"), "pg/g/cp/coord");
    EXPECT_EQ(processInboxKey("pg/g/", 3, 0xabcull), "pg/g/cp/proc/3/0000000000000abc");
    EXPECT_EQ(coordinatorInboxKey(""), "cp/coord");

    const std::string enc = encodeEndpoint("tcp://h|inbox=x:1", 0xfeedull);
    auto dec = decodeEndpoint(enc);
    ASSERT_TRUE(dec.has_value());
    EXPECT_EQ(dec->endpoint, "tcp://h|inbox=x:1");
    EXPECT_EQ(dec->nonce, 0xfeedull);
    EXPECT_TRUE(encodeEndpoint("", 7).empty());
    EXPECT_FALSE(decodeEndpoint("tcp://h").has_value());
    EXPECT_FALSE(decodeEndpoint("tcp://h|inbox=123").has_value());
    EXPECT_FALSE(decodeEndpoint("tcp://h|inbox=000000000000000G").has_value());
    // An empty data-plane part is never encoded: nothing to probe.
    EXPECT_FALSE(decodeEndpoint("|inbox=0123456789abcdef").has_value());
    EXPECT_LE(encodeEndpoint(std::string(kMaxDataEndpointBytes, 'e'), ~0ull).size(),
              kMaxEndpointBytes);
}

// ---- membership flows ------------------------------------------------------

TEST(ControlPlaneHostTest, FourFoundersBootstrap) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
    for (uint32_t r = 0; r < 4; ++r) {
        EXPECT_EQ(g.host(r).epoch(), 1u);
        EXPECT_EQ(g.log(r).epoch(), 1u);
        EXPECT_EQ(g.host(r).incarnation(), 1u);
        EXPECT_EQ(g.host(r).view().slots[r].member, GMS::kActive);
    }
    EXPECT_TRUE(g.coord().view().bootstrapped);
    EXPECT_EQ(g.host(1).peerEndpoint(2), endpointOf(2));
    Status synced = g.host(0).awaitView(
        [](const GroupView& v) {
            for (const SlotInfo& s : v.slots) {
                if (s.endpoint.empty())
                    return false;
            }
            return true;
        },
        in(5s));
    EXPECT_TRUE(synced.ok()) << synced.toString();
    EXPECT_EQ(g.host(0).numSyncedRanks(), 4);
}

TEST(ControlPlaneHostTest, ScaleUpIntoReservedSlot) {
    HostGroup g(8, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    ASSERT_NO_FATAL_FAILURE(g.addExtension(4));
    EXPECT_EQ(g.host(4).view().slots[4].member, GMS::kInactive);
    EXPECT_EQ(g.host(0).peerState({4}), std::vector<bool>{false});  // not joined yet
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(4, 0));
    g.expectAllSee({0, 1, 2, 3, 4}, maskOf(8, {0, 1, 2, 3, 4}));
    for (uint32_t r = 0; r <= 4; ++r)
        EXPECT_EQ(g.log(r).size(), 5) << "rank " << r;
    EXPECT_EQ(g.host(4).epoch(), 2u);
    // A redundant proposal succeeds without a new epoch.
    Status again = g.host(1).activateRanks({4}, in(5s));
    EXPECT_TRUE(again.ok()) << again.toString();
    EXPECT_EQ(g.host(1).epoch(), 2u);
}

TEST(ControlPlaneHostTest, DeactivateThenRejoinInPlace) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    Status st = g.host(1).deactivateRanks({3}, in(5s));
    ASSERT_TRUE(st.ok()) << st.toString();
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2}));
    EXPECT_EQ(g.log(3).size(), 3);
    // The deactivated process is alive: it rejoins with the same incarnation.
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 0));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
    EXPECT_EQ(g.host(3).incarnation(), 1u);
    // Deactivating a middle rank keeps the size: holes are counted.
    st = g.host(0).deactivateRanks({1}, in(5s));
    ASSERT_TRUE(st.ok()) << st.toString();
    g.expectAllSee({0, 2, 3}, maskOf(4, {0, 2, 3}));
    EXPECT_EQ(g.log(0).size(), 4);
}

// join_group and activate_ranks return only once the view callback (what
// the torch layer's active_ranks and size follow) has seen the commit, even
// when that callback is slow: checked from right after the calls return.
TEST(ControlPlaneHostTest, JoinAndActivateReturnAfterTheViewCallbackRan) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    Status st = g.host(0).deactivateRanks({3}, in(5s));
    ASSERT_TRUE(st.ok()) << st.toString();
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2}));
    for (uint32_t r = 0; r < 4; ++r)
        g.log(r).setDelay(300ms);

    Status joined;
    std::vector<int32_t> joiner_saw;
    int joiner_size = -1;
    std::thread t([&] {
        joined = g.host(3).joinGroup(in(10s));
        joiner_saw = g.log(3).mask();
        joiner_size = g.log(3).size();
    });
    Status ready = g.host(0).awaitView(
        [](const GroupView& v) {
            return v.slots[3].member == GMS::kAwaitingActivation &&
                   v.slots[3].rank == RankState::kHealthy && !v.slots[3].endpoint.empty();
        },
        in(10s));
    ASSERT_TRUE(ready.ok()) << ready.toString();
    Status activated = g.host(0).activateRanks({3}, in(10s));
    const std::vector<int32_t> proposer_saw = g.log(0).mask();
    t.join();
    ASSERT_TRUE(activated.ok()) << activated.toString();
    ASSERT_TRUE(joined.ok()) << joined.toString();
    EXPECT_EQ(joiner_saw, maskOf(4, {0, 1, 2, 3}));
    EXPECT_EQ(joiner_size, 4);
    EXPECT_EQ(proposer_saw, maskOf(4, {0, 1, 2, 3}));
    // Every member that polls get_peer_state sees the Active rank as ready,
    // so a redundant recover_ranks from the loop's losers follows and succeeds.
    for (uint32_t r : {1u, 2u}) {
        Status seen = g.host(r).awaitView([](const GroupView& v) { return v.isActive(3); }, in(5s));
        ASSERT_TRUE(seen.ok()) << seen.toString();
        EXPECT_EQ(g.host(r).peerState({3}), std::vector<bool>{true}) << "rank " << r;
        Status again = g.host(r).activateRanks({3}, in(5s));
        EXPECT_TRUE(again.ok()) << again.toString();
    }
}

TEST(ControlPlaneHostTest, JoinWithNobodyActivatingFailsAtItsDeadline) {
    HostGroup g(8, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    ASSERT_NO_FATAL_FAILURE(g.addExtension(5));
    const auto t0 = Clock::now();
    Status st = g.host(5).joinGroup(in(600ms));
    const int64_t elapsed = msSince(t0);
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("no online member proposed activate_ranks/recover_ranks"),
              std::string::npos)
        << st.message();
    // Not early (load can only make it later); how late is not a unit
    // test's business.
    EXPECT_GE(elapsed, 300);
    // The slot went back to Inactive; the group did not change.
    Status back = g.host(0).awaitView(
        [](const GroupView& v) { return v.slots[5].member == GMS::kInactive; }, in(2s));
    EXPECT_TRUE(back.ok()) << back.toString();
    EXPECT_EQ(g.host(0).groupSize(), 4);
}

TEST(ControlPlaneHostTest, CallsFailClearlyWhenTheyCannotSucceed) {
    HostGroup g(8, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    // A founder refused after bootstrap: final, no retry.
    ASSERT_NO_FATAL_FAILURE(g.spawn(6, false));
    Status st = g.host(6).start(endpointOf(6), in(5s));
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.toString();
    EXPECT_NE(st.message().find("is_extension=True"), std::string::npos) << st.message();
    // Activation of a rank nobody runs fails at its deadline with the reason.
    st = g.host(0).activateRanks({7}, in(500ms));
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("proposal failed"), std::string::npos) << st.message();
    // Without a Coordinator, a registration times out naming what it waited for.
    HostGroup lonely(4, 4);
    ASSERT_NO_FATAL_FAILURE(lonely.spawn(0, false));
    st = lonely.host(0).start(endpointOf(0), in(300ms));
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.message().find("no RegisterReply"), std::string::npos) << st.message();
}

TEST(ControlPlaneHostTest, GarbageAndForeignMessagesAreDropped) {
    InProcessKVStore store;
    Mailbox mail(&store, kPrefix);
    // Sent before anyone runs: the hosts must read past them.
    ASSERT_TRUE(mail.sendBytes(coordinatorInboxKey(kPrefix), "not a message").ok());
    ControlMessage foreign;
    foreign.header.group_id = kGroup;
    foreign.header.sender_rank = 0;
    foreign.header.secret = "wrong";
    foreign.body = RegisterRequest{99, false, "x"};
    ASSERT_TRUE(mail.sendBytes(coordinatorInboxKey(kPrefix), serialize(foreign)).ok());
    foreign.header.secret = kSecret;
    foreign.header.group_id = "another-group";
    ASSERT_TRUE(mail.sendBytes(coordinatorInboxKey(kPrefix), serialize(foreign)).ok());

    HostGroup g(2, 2, {}, &store);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    // Garbage, a forged probe and a stray reply into a member's inbox.
    const uint64_t nonce = decodeEndpoint(g.host(1).view().slots[1].endpoint)->nonce;
    const std::string inbox = processInboxKey(kPrefix, 1, nonce);
    ASSERT_TRUE(mail.sendBytes(inbox, std::string("MCCP\x01\x10", 6)).ok());
    ControlMessage probe;
    probe.header.group_id = kGroup;
    probe.header.sender_rank = 0;
    probe.header.secret = "wrong";
    probe.body = Probe{1, 1, 1, 5};
    ASSERT_TRUE(mail.sendBytes(inbox, serialize(probe)).ok());
    probe.header.secret = kSecret;
    probe.body = ProbeReply{12345, 1};
    ASSERT_TRUE(mail.sendBytes(inbox, serialize(probe)).ok());
    // The group still works.
    Status st = g.host(0).deactivateRanks({1}, in(5s));
    ASSERT_TRUE(st.ok()) << st.toString();
    g.expectAllSee({0, 1}, maskOf(2, {0}));
}

TEST(ControlPlaneHostTest, StopIsPromptAndAbortsCallsInFlight) {
    HostGroup g(8, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    ASSERT_NO_FATAL_FAILURE(g.addExtension(4));
    Status joined;
    std::thread t([&] { joined = g.host(4).joinGroup(in(20s)); });
    Status waiting = g.host(0).awaitView(
        [](const GroupView& v) { return v.slots[4].member == GMS::kAwaitingActivation; }, in(5s));
    EXPECT_TRUE(waiting.ok()) << waiting.toString();
    // Prompt means it does not wait for the join's 20 s deadline: the call
    // in flight ends kAborted (its deadline would say kTimeout).
    for (uint32_t r = 0; r <= 4; ++r)
        g.host(r).stop();
    t.join();
    EXPECT_EQ(joined.code(), StatusCode::kAborted) << joined.toString();
    g.coord().stop();
}

// An in-process store whose writes from one chosen thread wait until
// released (bounded, so a broken test cannot hang the suite).
class GatedStore : public InProcessKVStore {
public:
    Status set(const std::string& key, const std::string& value) override {
        std::unique_lock<std::mutex> lock(mu_);
        if (gated_ == std::this_thread::get_id()) {
            blocked_ = true;
            cv_.notify_all();
            cv_.wait_for(lock, 10s, [&] { return released_; });
            blocked_ = false;
        }
        lock.unlock();
        return InProcessKVStore::set(key, value);
    }
    void gate(std::thread::id t) {
        std::lock_guard<std::mutex> lock(mu_);
        gated_ = t;
    }
    bool waitBlocked(std::chrono::milliseconds timeout) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, timeout, [&] { return blocked_; });
    }
    void release() {
        std::lock_guard<std::mutex> lock(mu_);
        released_ = true;
        cv_.notify_all();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::thread::id gated_;
    bool blocked_ = false;
    bool released_ = false;
};

// The torch layer reads the epoch on every op: a message going out through
// the store (sent with the host's lock held) must not hold that read up.
TEST(ControlPlaneHostTest, EpochIsReadWhileAMessageWaitsOnTheStore) {
    GatedStore store;
    HostGroup g(2, 2, {}, &store);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    std::promise<std::thread::id> sender_id;
    std::promise<void> go;
    std::thread sender([&] {
        sender_id.set_value(std::this_thread::get_id());
        go.get_future().wait();
        EXPECT_TRUE(g.host(1).publishEndpoint("tcp://10.0.0.1:7001").ok());
    });
    store.gate(sender_id.get_future().get());
    go.set_value();
    ASSERT_TRUE(store.waitBlocked(5s)) << "the endpoint was never written to the store";
    auto epoch = std::async(std::launch::async, [&] { return g.host(1).epoch(); });
    const bool answered = epoch.wait_for(5s) == std::future_status::ready;
    store.release();
    sender.join();
    ASSERT_TRUE(answered) << "epoch() waited for the store write";
    EXPECT_EQ(epoch.get(), 1u);
}

// ---- across processes ------------------------------------------------------

// Founders 1 and 2 run in forked children over a FileKVStore; the parent runs
// the Coordinator and founder 0. Rank 2 leaves; everyone sees the size drop.
TEST(ControlPlaneHostTest, CrossProcessOverFileKVStore) {
    char tmpl[] = "/tmp/mc_cp_host_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    // Set once rank 0 has seen all three members; rank 2 leaves only then.
    constexpr char kFullGroupSeenKey[] = "test/full_group_seen";
    std::vector<pid_t> kids;
    // Fork before this process starts any thread of its own.
    for (uint32_t r : {1u, 2u}) {
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid != 0) {
            kids.push_back(pid);
            continue;
        }
        int code = 0;
        {
            FileKVStore store(dir);
            auto made = MemberHost::create(memberConfig(r, 3, false, {}), &store, nullptr);
            if (!made.ok())
                ::_exit(10);
            auto host = std::move(made).value();
            if (!host->start(endpointOf(r), in(15s)).ok()) {
                code = 11;
            } else if (host->groupSize() != 3) {
                code = 12;
            } else if (r == 2) {
                // Rank 0 applies only the newest view it finds, so a leave
                // before it has seen the whole group would skip the state
                // the test checks first.
                if (!store.get(kFullGroupSeenKey, in(15s)).ok())
                    code = 15;
                else
                    code = host->leave().ok() ? 0 : 13;
            } else if (!host->awaitView([](const GroupView& v) { return v.groupSize() == 2; },
                                        in(15s))
                            .ok()) {
                code = 14;
            }
            host->stop();
        }
        ::_exit(code);
    }
    FileKVStore store(dir);
    {
        HostGroup g(3, 3, {}, &store);
        ASSERT_NO_FATAL_FAILURE(g.startCoordinator());
        ASSERT_NO_FATAL_FAILURE(g.spawn(0, false));
        Status st = g.host(0).start(endpointOf(0), in(15s));
        ASSERT_TRUE(st.ok()) << st.toString();
        EXPECT_TRUE(g.log(0).waitFor(maskOf(3, {0, 1, 2})));
        ASSERT_TRUE(store.set(kFullGroupSeenKey, "1").ok());
        EXPECT_TRUE(g.log(0).waitFor(maskOf(3, {0, 1}), 15s));
        EXPECT_EQ(g.host(0).view().slots[2].member, GMS::kLeft);
    }
    for (pid_t pid : kids) {
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        EXPECT_TRUE(WIFEXITED(status)) << "child " << pid;
        EXPECT_EQ(WEXITSTATUS(status), 0) << "child " << pid;
    }
    std::string cmd = "rm -rf '" + dir + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace mooncake::pg::control_plane
