// The control-plane hosts end to end: a CoordinatorHost and MemberHosts on
// real threads, talking through KVStore inboxes (InProcessKVStore, and
// FileKVStore across forked processes). Every wait is on a condition with a
// deadline; nothing sleeps to synchronize.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/control_plane/coordinator_host.h"
#include "mooncake-pg/control_plane/mailbox.h"
#include "mooncake-pg/control_plane/member_host.h"

namespace mooncake::pg::control_plane {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using GMS = GroupMemberState;

constexpr const char* kGroup = "hostgroup";
constexpr const char* kSecret = "hs3cret";
constexpr const char* kPrefix = "pg/hostgroup";
// A live member must answer a probe within kProbeTimeout even on a loaded
// 2-core machine, or reconciliation judges it dead: far more than a reply
// takes. A silent member costs one window, so it stays a few seconds.
constexpr Millis kWindow{2500};
constexpr Millis kProbeTimeout{1000};

Deadline in(std::chrono::milliseconds d) {
    return Deadline::after(d);
}

int64_t msSince(Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string endpointOf(uint32_t rank) {
    return "tcp://10.0.0." + std::to_string(rank) + ":7000";
}

std::vector<uint8_t> hint(uint32_t max, std::vector<uint32_t> failed) {
    std::vector<uint8_t> h(max, 0);
    for (uint32_t f : failed)
        h[f] = 1;
    return h;
}

std::vector<int32_t> maskOf(uint32_t max, std::vector<uint32_t> active) {
    std::vector<int32_t> m(max, 0);
    for (uint32_t a : active)
        m[a] = 1;
    return m;
}

// What one host's view callback reported, with waits on it.
class ViewLog {
public:
    ViewCallback callback() {
        return [this](const std::vector<int32_t>& mask, uint32_t epoch, int size) {
            // A slow consumer (the torch layer copying into a tensor): the
            // host must not let a blocking call return before this is done.
            std::this_thread::sleep_for(delay_.load());
            std::lock_guard<std::mutex> lock(mu_);
            mask_ = mask;
            epoch_ = epoch;
            size_ = size;
            cv_.notify_all();
        };
    }
    bool waitFor(const std::vector<int32_t>& mask, Millis timeout = 5s) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, timeout, [&] { return mask_ == mask; });
    }
    int size() const {
        std::lock_guard<std::mutex> lock(mu_);
        return size_;
    }
    std::vector<int32_t> mask() const {
        std::lock_guard<std::mutex> lock(mu_);
        return mask_;
    }
    void setDelay(std::chrono::milliseconds d) { delay_.store(d); }
    uint32_t epoch() const {
        std::lock_guard<std::mutex> lock(mu_);
        return epoch_;
    }

private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<int32_t> mask_;
    uint32_t epoch_ = 0;
    int size_ = -1;
    std::atomic<std::chrono::milliseconds> delay_{std::chrono::milliseconds(0)};
};

MemberHostConfig memberConfig(uint32_t rank, uint32_t max, bool is_extension, FailureMode mode) {
    MemberHostConfig c;
    c.agent.group_id = kGroup;
    c.agent.secret = kSecret;
    c.agent.rank = rank;
    c.agent.max_group_size = max;
    c.agent.is_extension = is_extension;
    c.agent.mode = mode;
    c.agent.register_timeout = 10s;
    c.agent.default_join_timeout = 10s;
    c.agent.default_proposal_timeout = 10s;
    c.agent.reply_grace = 2s;
    c.key_prefix = kPrefix;
    c.probe_timeout = kProbeTimeout;
    c.poll_interval = 20ms;
    c.register_retry = 50ms;
    return c;
}

CoordinatorHostConfig coordinatorConfig(uint32_t max, uint32_t founders, FailureMode mode) {
    CoordinatorHostConfig c;
    c.coordinator.group_id = kGroup;
    c.coordinator.secret = kSecret;
    c.coordinator.max_group_size = max;
    c.coordinator.founding_size = founders;
    c.coordinator.mode = mode;
    c.coordinator.reconcile_window = kWindow;
    c.coordinator.default_proposal_timeout = 10s;
    c.coordinator.default_join_timeout = 10s;
    c.key_prefix = kPrefix;
    c.poll_interval = 20ms;
    return c;
}

// A Coordinator host and up to `max` member hosts over one store.
class HostGroup {
public:
    HostGroup(uint32_t max, uint32_t founders, FailureMode mode = {}, KVStore* store = nullptr)
        : max_(max), founders_(founders), mode_(mode), logs_(max), hosts_(max) {
        store_ = store ? store : &own_store_;
    }
    ~HostGroup() {
        for (auto& h : hosts_) {
            if (h)
                h->stop();
        }
        if (coord_)
            coord_->stop();
    }

    KVStore* store() { return store_; }
    MemberHost& host(uint32_t r) { return *hosts_[r]; }
    ViewLog& log(uint32_t r) { return *logs_[r]; }
    CoordinatorHost& coord() { return *coord_; }

    void startCoordinator() {
        auto c = CoordinatorHost::start(coordinatorConfig(max_, founders_, mode_), store_);
        ASSERT_TRUE(c.ok()) << c.status().toString();
        coord_ = std::move(c).value();
    }

    // Creates (or replaces) the host of slot `r`; a replacement gets a new nonce.
    void spawn(uint32_t r, bool is_extension) {
        logs_[r] = std::make_unique<ViewLog>();
        auto h = MemberHost::create(memberConfig(r, max_, is_extension, mode_), store_,
                                    logs_[r]->callback());
        ASSERT_TRUE(h.ok()) << h.status().toString();
        hosts_[r] = std::move(h).value();
    }

    // The Coordinator plus every founder, registering concurrently (each
    // start() returns only once all of them registered).
    void bootstrap() {
        ASSERT_NO_FATAL_FAILURE(startCoordinator());
        for (uint32_t r = 0; r < founders_; ++r)
            ASSERT_NO_FATAL_FAILURE(spawn(r, false));
        std::vector<Status> results(founders_);
        std::vector<std::thread> threads;
        for (uint32_t r = 0; r < founders_; ++r) {
            threads.emplace_back([&, r] { results[r] = hosts_[r]->start(endpointOf(r), in(10s)); });
        }
        for (auto& t : threads)
            t.join();
        for (uint32_t r = 0; r < founders_; ++r)
            ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].toString();
    }

    // An extension process for slot `r`, registered (Inactive).
    void addExtension(uint32_t r) {
        ASSERT_NO_FATAL_FAILURE(spawn(r, true));
        Status st = hosts_[r]->start(endpointOf(r), in(10s));
        ASSERT_TRUE(st.ok()) << st.toString();
    }

    // `joiner` calls join_group while `proposer` waits until get_peer_state
    // says it can be activated, then activates it.
    void joinAndActivate(uint32_t joiner, uint32_t proposer) {
        Status joined;
        std::thread t([&] { joined = hosts_[joiner]->joinGroup(in(10s)); });
        Status ready = hosts_[proposer]->awaitView(
            [joiner](const GroupView& v) {
                const SlotInfo& s = v.slots[joiner];
                return s.member == GMS::kAwaitingActivation && s.rank == RankState::kHealthy &&
                       !s.endpoint.empty();
            },
            in(10s));
        EXPECT_EQ(hosts_[proposer]->peerState({joiner}), std::vector<bool>{ready.ok()});
        Status activated = hosts_[proposer]->activateRanks({joiner}, in(10s));
        t.join();
        ASSERT_TRUE(ready.ok()) << ready.toString();
        ASSERT_TRUE(activated.ok()) << activated.toString();
        ASSERT_TRUE(joined.ok()) << joined.toString();
    }

    // Every listed live host's callback reported exactly this mask.
    void expectAllSee(const std::vector<uint32_t>& ranks, const std::vector<int32_t>& mask) {
        for (uint32_t r : ranks) {
            EXPECT_TRUE(logs_[r]->waitFor(mask)) << "rank " << r;
            EXPECT_EQ(hosts_[r]->activeRanks(), mask) << "rank " << r;
            EXPECT_EQ(hosts_[r]->groupSize(), groupSizeFromMask(mask)) << "rank " << r;
        }
    }

private:
    uint32_t max_;
    uint32_t founders_;
    FailureMode mode_;
    InProcessKVStore own_store_;
    KVStore* store_;
    std::vector<std::unique_ptr<ViewLog>> logs_;
    std::unique_ptr<CoordinatorHost> coord_;
    std::vector<std::unique_ptr<MemberHost>> hosts_;
};

// Runs `fn(rank)` on one thread per rank and returns the results in order.
std::vector<Status> onThreads(const std::vector<uint32_t>& ranks,
                              const std::function<Status(uint32_t)>& fn) {
    std::vector<Status> results(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i)
        threads.emplace_back([&, i] { results[i] = fn(ranks[i]); });
    for (auto& t : threads)
        t.join();
    return results;
}

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

TEST(ControlPlaneHostTest, VanishedMemberIsDeactivatedByReconciliation) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    g.host(3).stop();  // no Leave: to the group it just stops answering
    // The survivors' data plane failed without naming anyone: only the
    // probes (which rank 3 no longer answers) can find the culprit.
    auto results = onThreads(
        {0, 1, 2}, [&](uint32_t r) { return g.host(r).syncAfterFailure(false, {}, in(20s)); });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    for (uint32_t r = 0; r < 3; ++r) {
        // Returned with the reconciliation's view already applied.
        EXPECT_EQ(g.host(r).activeRanks(), maskOf(4, {0, 1, 2})) << "rank " << r;
        EXPECT_EQ(g.host(r).view().slots[3].rank, RankState::kOffline);
    }
    g.expectAllSee({0, 1, 2}, maskOf(4, {0, 1, 2}));
}

TEST(ControlPlaneHostTest, StalledMemberNamedInHintsIsExcluded) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    // Rank 3's host thread is alive and answers probes, but its data plane
    // stalled: every survivor's collective names it.
    auto results = onThreads({0, 1, 2}, [&](uint32_t r) {
        return g.host(r).syncAfterFailure(false, hint(4, {3}), in(20s));
    });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2}));
    EXPECT_EQ(g.host(3).view().slots[3].member, GMS::kInactive);
    for (uint32_t r = 0; r < 3; ++r)
        EXPECT_EQ(g.host(0).view().slots[r].rank, RankState::kHealthy);
    // The suspicion ended with the epoch: rank 3 can be recovered in place.
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 2));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
}

TEST(ControlPlaneHostTest, FrameworkManagedModeOnlyReports) {
    HostGroup g(4, 4, FailureMode{false, false});
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    // Deferred evidence first, then the sync without a hint: the note counts.
    for (uint32_t r = 0; r < 3; ++r)
        g.host(r).noteEvidence(hint(4, {3}));
    auto results = onThreads(
        {0, 1, 2}, [&](uint32_t r) { return g.host(r).syncAfterFailure(false, {}, in(10s)); });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    for (uint32_t r = 0; r < 4; ++r) {
        // Reported, not acted upon: rank 3 is still Active, but Offline. The
        // reconciliation still ends in a fresh epoch (a data-plane restart).
        Status resynced =
            g.host(r).awaitView([](const GroupView& v) { return v.epoch == 2; }, in(5s));
        EXPECT_TRUE(resynced.ok()) << "rank " << r << ": " << resynced.toString();
        EXPECT_EQ(g.host(r).activeRanks(), maskOf(4, {0, 1, 2, 3})) << "rank " << r;
    }
    Status offline = g.host(0).awaitView(
        [](const GroupView& v) { return v.slots[3].rank == RankState::kOffline; }, in(2s));
    EXPECT_TRUE(offline.ok()) << offline.toString();
    // The framework decides.
    Status st = g.host(0).deactivateRanks({3}, in(5s));
    ASSERT_TRUE(st.ok()) << st.toString();
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2}));
}

TEST(ControlPlaneHostTest, LateReportOfAFailureAlreadyReconciledOpensNoOtherReconciliation) {
    HostGroup g(4, 4, FailureMode{false, false});
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    const uint64_t failed_in = g.host(0).view().epoch;
    for (uint32_t r = 0; r < 3; ++r)
        g.host(r).noteEvidence(hint(4, {3}));
    // Ranks 1 and 2 report. Rank 0 only answers the probe round, which is
    // all the window needs from it, so it closes with a fresh epoch.
    auto results = onThreads(
        {1, 2}, [&](uint32_t r) { return g.host(r).syncAfterFailure(false, {}, in(10s)); });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i + 1 << ": " << results[i].toString();
    Status resynced =
        g.host(0).awaitView([&](const GroupView& v) { return v.epoch == failed_in + 1; }, in(5s));
    ASSERT_TRUE(resynced.ok()) << resynced.toString();
    // Rank 0 reports the same failure only now (its worker was late): the
    // evidence is of the epoch the reconciliation already ended.
    Status late = g.host(0).syncAfterFailure(false, {}, in(10s));
    EXPECT_TRUE(late.ok()) << late.toString();
    EXPECT_EQ(g.host(0).view().epoch, failed_in + 1)
        << "the late report opened another reconciliation and restarted the data plane again";
    EXPECT_EQ(g.coord().view().epoch, failed_in + 1);
}

TEST(ControlPlaneHostTest, LateEvidenceAgainstADeactivatedRankDoesNotBlockItsRecovery) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    const uint64_t failed_in = g.host(2).view().epoch;
    // Ranks 0 and 1 name the stalled rank 3; the window closes on rank 2's
    // probe answers alone and deactivates it.
    auto results = onThreads({0, 1}, [&](uint32_t r) {
        return g.host(r).syncAfterFailure(false, hint(4, {3}), in(10s));
    });
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << "rank " << i << ": " << results[i].toString();
    Status dropped = g.host(2).awaitView(
        [&](const GroupView& v) { return v.epoch > failed_in && !v.isActive(3); }, in(5s));
    ASSERT_TRUE(dropped.ok()) << dropped.toString();
    // Rank 2's worker reports the same failure only now, naming rank 3.
    Status late = g.host(2).syncAfterFailure(false, hint(4, {3}), in(10s));
    EXPECT_TRUE(late.ok()) << late.toString();
    // Rank 3 (alive all along) is recovered in place, with rank 2 proposing:
    // rank 2 must not go on reporting it unreachable.
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 2));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
}

TEST(ControlPlaneHostTest, ReplacementRejoinsDeadSlotWithHigherIncarnation) {
    HostGroup g(4, 4);
    ASSERT_NO_FATAL_FAILURE(g.bootstrap());
    g.host(3).stop();
    // The launcher starts a replacement at once. Its first registration is
    // refused (the slot is still Active) and opens a window; once the window
    // deactivates the silent old process, the retry is accepted.
    ASSERT_NO_FATAL_FAILURE(g.addExtension(3));
    EXPECT_EQ(g.host(3).incarnation(), 2u);
    g.expectAllSee({0, 1, 2}, maskOf(4, {0, 1, 2}));
    ASSERT_NO_FATAL_FAILURE(g.joinAndActivate(3, 1));
    g.expectAllSee({0, 1, 2, 3}, maskOf(4, {0, 1, 2, 3}));
    EXPECT_EQ(g.host(0).view().slots[3].incarnation, 2u);
    EXPECT_EQ(g.coord().view().slots[3].incarnation, 2u);
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
