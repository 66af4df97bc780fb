// MemberHost::awaitView and the view callback. The torch layer's worker
// waits in awaitView for a newer view (a peer moved on to it), applies it and
// reruns the op; the op may then complete at once. The user-visible copy of
// the membership (get_active_ranks, get_world_size) is what the callback
// writes, so awaitView must not return before the callback has run for the
// view it returns on, just as the blocking calls do not.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/control_plane/coordinator_host.h"
#include "mooncake-pg/control_plane/member_host.h"

namespace mooncake::pg::control_plane {
namespace {

using namespace std::chrono_literals;

constexpr const char* kGroup = "viewgroup";
constexpr const char* kSecret = "v1ews";
constexpr const char* kPrefix = "pg/viewgroup";

// A view callback that, once armed, holds the next view until released.
class HeldCallback {
public:
    ViewCallback callback() {
        return [this](const std::vector<int32_t>& mask, uint32_t, int) {
            std::unique_lock<std::mutex> lock(mu_);
            if (armed_) {
                armed_ = false;
                held_ = true;
                cv_.notify_all();
                if (!cv_.wait_for(lock, 20s, [&] { return released_; }))
                    ADD_FAILURE() << "the held view callback was never released";
            }
            mask_ = mask;
            cv_.notify_all();
        };
    }
    void arm() {
        std::lock_guard<std::mutex> lock(mu_);
        armed_ = true;
    }
    bool awaitHeld() {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, 10s, [&] { return held_; });
    }
    void release() {
        std::lock_guard<std::mutex> lock(mu_);
        released_ = true;
        cv_.notify_all();
    }
    std::vector<int32_t> mask() const {
        std::lock_guard<std::mutex> lock(mu_);
        return mask_;
    }

private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool armed_ = false;
    bool held_ = false;
    bool released_ = false;
    std::vector<int32_t> mask_;
};

MemberHostConfig memberConfig(uint32_t rank) {
    MemberHostConfig c;
    c.agent.group_id = kGroup;
    c.agent.secret = kSecret;
    c.agent.rank = rank;
    c.agent.max_group_size = 2;
    c.agent.register_timeout = 10s;
    c.agent.default_proposal_timeout = 10s;
    c.agent.reply_grace = 2s;
    c.key_prefix = kPrefix;
    c.poll_interval = 20ms;
    return c;
}

TEST(ControlPlaneAwaitView, ReturnsOnlyAfterTheCallbackRanForTheView) {
    InProcessKVStore store;
    CoordinatorHostConfig cc;
    cc.coordinator.group_id = kGroup;
    cc.coordinator.secret = kSecret;
    cc.coordinator.max_group_size = 2;
    cc.coordinator.founding_size = 2;
    cc.coordinator.default_proposal_timeout = 10s;
    cc.key_prefix = kPrefix;
    cc.poll_interval = 20ms;
    auto coord = CoordinatorHost::start(cc, &store);
    ASSERT_TRUE(coord.ok()) << coord.status().toString();

    HeldCallback held;
    auto h0 = MemberHost::create(memberConfig(0), &store, nullptr);
    auto h1 = MemberHost::create(memberConfig(1), &store, held.callback());
    ASSERT_TRUE(h0.ok() && h1.ok());
    std::unique_ptr<MemberHost> host0 = std::move(h0).value();
    std::unique_ptr<MemberHost> host1 = std::move(h1).value();
    Status started1;
    std::thread t([&] { started1 = host1->start("tcp://10.0.0.1:7000", Deadline::after(10s)); });
    Status started0 = host0->start("tcp://10.0.0.0:7000", Deadline::after(10s));
    t.join();
    ASSERT_TRUE(started0.ok()) << started0.toString();
    ASSERT_TRUE(started1.ok()) << started1.toString();
    ASSERT_EQ(held.mask(), (std::vector<int32_t>{1, 1}));

    const uint64_t before = host1->epoch();
    held.arm();
    Status st = host0->deactivateRanks({1}, Deadline::after(10s));
    ASSERT_TRUE(st.ok()) << st.toString();
    ASSERT_TRUE(held.awaitHeld()) << "rank 1 never got the view callback";
    auto newer = [before](const GroupView& v) { return v.epoch > before; };

    // The host's mirror already holds the new view, but its callback is
    // held: awaitView must not report it yet.
    EXPECT_GT(host1->epoch(), before);
    st = host1->awaitView(newer, Deadline::after(300ms));
    EXPECT_EQ(st.code(), StatusCode::kTimeout)
        << st.toString() << " with the callback still showing mask " << held.mask()[0] << ","
        << held.mask()[1];

    held.release();
    st = host1->awaitView(newer, Deadline::after(10s));
    EXPECT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(held.mask(), (std::vector<int32_t>{1, 0}));

    host1->stop();
    host0->stop();
    coord.value()->stop();
}

}  // namespace
}  // namespace mooncake::pg::control_plane
