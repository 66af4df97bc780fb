// Helpers of the control-plane host tests (control_plane_host_test.cc,
// control_plane_host_failure_test.cc): a Coordinator host and member hosts
// over one store, the views their callbacks saw, and waits on them.
#pragma once

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

namespace mooncake::pg::control_plane::host_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using GMS = GroupMemberState;

inline constexpr const char* kGroup = "hostgroup";
inline constexpr const char* kSecret = "hs3cret";
inline constexpr const char* kPrefix = "pg/hostgroup";
// A live member must answer a probe within kProbeTimeout even on a loaded
// 2-core machine, or reconciliation judges it dead: far more than a reply
// takes. A silent member costs one window, so it stays a few seconds.
inline constexpr Millis kWindow{2500};
inline constexpr Millis kProbeTimeout{1000};

inline Deadline in(std::chrono::milliseconds d) {
    return Deadline::after(d);
}

inline int64_t msSince(Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

inline std::string endpointOf(uint32_t rank) {
    return "tcp://10.0.0." + std::to_string(rank) + ":7000";
}

inline std::vector<uint8_t> hint(uint32_t max, std::vector<uint32_t> failed) {
    std::vector<uint8_t> h(max, 0);
    for (uint32_t f : failed)
        h[f] = 1;
    return h;
}

inline std::vector<int32_t> maskOf(uint32_t max, std::vector<uint32_t> active) {
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

inline MemberHostConfig memberConfig(uint32_t rank, uint32_t max, bool is_extension,
                                     FailureMode mode) {
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

inline CoordinatorHostConfig coordinatorConfig(uint32_t max, uint32_t founders, FailureMode mode) {
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
inline std::vector<Status> onThreads(const std::vector<uint32_t>& ranks,
                                     const std::function<Status(uint32_t)>& fn) {
    std::vector<Status> results(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i)
        threads.emplace_back([&, i] { results[i] = fn(ranks[i]); });
    for (auto& t : threads)
        t.join();
    return results;
}

}  // namespace mooncake::pg::control_plane::host_test
