// SlotInfo::active_since through every Coordinator transition: the epoch at
// which a slot's member became Active (or was restarted with every Active
// member by a reconciliation), 0 while not Active. The P2P engine restarts a
// pair exactly when max(active_since) of its two ranks changes.
#include <gtest/gtest.h>

#include <variant>
#include <vector>

#include "mooncake-pg/control_plane/coordinator.h"
#include "tests/cpp/pg/control_plane_test_util.h"

namespace mooncake::pg::control_plane::testing {
namespace {

std::vector<uint64_t> since(const GroupView& v) {
    std::vector<uint64_t> out;
    for (const SlotInfo& s : v.slots)
        out.push_back(s.active_since);
    return out;
}

using Since = std::vector<uint64_t>;

TEST(ActiveSinceTest, FoundersAtBootstrapAndReservedSlotsZero) {
    CoordinatorDriver d(coordinatorConfig(6, 3));
    d.registerRank(0, false);
    d.registerRank(1, false);
    EXPECT_EQ(since(d.view()), Since(6, 0)) << "before bootstrap";
    d.registerRank(2, false);
    ASSERT_EQ(d.view().epoch, 1u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 1, 0, 0, 0}));
}

TEST(ActiveSinceTest, ActivationStampsOnlyTheTargets) {
    auto d = bootstrapped(8, 4);
    d.prepareJoiner(4);
    d.prepareJoiner(6, {4});  // the joiners must reach each other too
    EXPECT_EQ(since(d.view())[4], 0u) << "awaiting activation is not Active";
    d.activate(0, {4, 6});
    ASSERT_EQ(d.view().epoch, 2u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 1, 1, 2, 0, 2, 0}));
    // A redundant activation commits nothing and stamps nothing.
    d.activate(1, {4}, 5);
    EXPECT_EQ(d.view().epoch, 2u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 1, 1, 2, 0, 2, 0}));
}

TEST(ActiveSinceTest, DeactivationAndLeaveClearOnlyTheirSlots) {
    auto d = bootstrapped(8, 4);
    d.deactivate(0, {2});
    ASSERT_EQ(d.view().epoch, 2u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 0, 1, 0, 0, 0, 0}));
    d.send(3, Leave{});
    ASSERT_EQ(d.view().epoch, 3u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 0, 0, 0, 0, 0, 0}));
    // Rejoining in place is a new activation.
    d.send(2, JoinRequest{0});
    d.activate(0, {2});
    ASSERT_EQ(d.view().epoch, 4u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 4, 0, 0, 0, 0, 0}));
}

TEST(ActiveSinceTest, ReplacementIsStampedWithItsActivation) {
    auto d = bootstrapped(8, 4);
    d.deactivate(0, {3});
    d.registerRank(3, true);  // a new process in the slot
    ASSERT_EQ(d.incarnation(3), 2u);
    d.fullMesh({0, 1, 2, 3});
    d.send(3, JoinRequest{0});
    d.activate(0, {3});
    ASSERT_EQ(d.view().epoch, 3u);
    EXPECT_EQ(since(d.view()), (Since{1, 1, 1, 3, 0, 0, 0, 0}));
}

TEST(ActiveSinceTest, DeactivatingReconciliationRestartsEverySurvivor) {
    auto d = bootstrapped(8, 4);
    d.prepareJoiner(4);
    d.activate(0, {4});  // epoch 2: slot 4 since 2, founders since 1
    d.evidence(0, {2});
    d.fullMesh({0, 1, 3, 4});
    d.tickAt(30000ms);
    ASSERT_EQ(d.view().epoch, 3u);
    ASSERT_EQ(d.view().activeMask(), mask({1, 1, 0, 1, 1, 0, 0, 0}));
    EXPECT_EQ(since(d.view()), (Since{3, 3, 0, 3, 3, 0, 0, 0}));
}

TEST(ActiveSinceTest, ResyncWithoutDeactivationRestartsEveryActiveMember) {
    auto d = bootstrapped(8, 4, FailureMode{false, false});
    d.deactivate(0, {1});  // epoch 2
    d.evidence(0, {3});
    d.fullMesh({0, 2});
    d.tickAt(30000ms);
    ASSERT_EQ(d.view().epoch, 3u);
    // Rank 3 stays Active (framework-managed) and restarts with the others.
    EXPECT_EQ(since(d.view()), (Since{3, 0, 3, 3, 0, 0, 0, 0}));
}

// Members see the field through the wire: the ViewUpdate broadcast after a
// commit carries the Coordinator's values and survives serialization.
TEST(ActiveSinceTest, ViewUpdatesCarryIt) {
    auto d = bootstrapped(8, 4);
    d.prepareJoiner(5);
    auto fx = d.activate(0, {5});
    int views = 0;
    for (const Broadcast& b : effectsOf<Broadcast>(fx)) {
        if (!std::holds_alternative<ViewUpdate>(b.message.body))
            continue;
        ++views;
        auto parsed = parseControlMessage(serialize(b.message));
        ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
        Since got;
        for (const SlotInfo& s : std::get<ViewUpdate>(parsed.value().body).slots)
            got.push_back(s.active_since);
        EXPECT_EQ(got, (Since{1, 1, 1, 1, 0, 2, 0, 0}));
    }
    EXPECT_GT(views, 0);
}

}  // namespace
}  // namespace mooncake::pg::control_plane::testing
