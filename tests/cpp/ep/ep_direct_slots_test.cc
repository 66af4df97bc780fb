// The host's slot choice for direct FP8 dispatch (core/direct_slots.h), op by
// op: which slot an op's outputs are views of, which it names for the next,
// and that a slot held by a view is never named.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "mooncake-ep/core/direct_slots.h"

namespace mooncake::ep {
namespace {

// Runs one op; returns its choice. `views` gets what its outputs would hold.
EpDirectSlots::Choice op(EpDirectSlots& slots, std::vector<std::shared_ptr<void>>* views,
                         bool use_fp8 = true, bool capturing = false, bool direct = true) {
    const EpDirectSlots::Choice c = slots.choose(direct, use_fp8, capturing);
    if (c.out >= 0 && views != nullptr)
        views->push_back(slots.hold(c.out));
    slots.launched(c);
    return c;
}

TEST(EpDirectSlots, TheFirstOpNamesASlotTheNextWritesIntoIt) {
    EpDirectSlots slots;
    const auto first = op(slots, nullptr);
    EXPECT_EQ(first.out, -1);  // nobody named a slot for it
    EXPECT_EQ(first.next, 0);
    const auto second = op(slots, nullptr);
    EXPECT_EQ(second.out, 0);
    EXPECT_EQ(second.next, 1);              // not the slot named for itself
    const auto third = op(slots, nullptr);  // its outputs were dropped at once
    EXPECT_EQ(third.out, 1);
    EXPECT_EQ(third.next, 0);
}

TEST(EpDirectSlots, ASlotHeldByAViewIsNeverNamed) {
    EpDirectSlots slots;
    std::vector<std::shared_ptr<void>> held;
    op(slots, &held);  // names 0
    EXPECT_EQ(op(slots, &held).out, 0);
    EXPECT_EQ(op(slots, &held).out, 1);
    const auto c = op(slots, &held);
    EXPECT_EQ(c.out, 2);
    EXPECT_EQ(c.next, -1);                // 0, 1 and 2 held
    EXPECT_EQ(op(slots, &held).out, -1);  // tensors of its own
    held.erase(held.begin());             // slot 0's views freed
    const auto after = op(slots, &held);
    EXPECT_EQ(after.out, -1);
    EXPECT_EQ(after.next, 0);
    EXPECT_EQ(op(slots, &held).out, 0);
}

TEST(EpDirectSlots, ALoopThatRebindsAfterTheCallStaysDirect) {
    // `recv = dispatch(...)`: the previous op's views live until the call returns.
    EpDirectSlots slots;
    std::vector<std::shared_ptr<void>> previous, current;
    op(slots, &previous);
    for (int i = 0; i < 10; ++i) {
        current.clear();
        const auto c = op(slots, &current);
        EXPECT_GE(c.out, 0) << i;
        EXPECT_GE(c.next, 0) << i;
        previous.swap(current);
    }
}

TEST(EpDirectSlots, CapturesAndOtherOpsNameNothingOrWriteNothing) {
    EpDirectSlots slots;
    op(slots, nullptr);  // names 0
    const auto captured = op(slots, nullptr, true, /*capturing=*/true);
    EXPECT_EQ(captured.out, -1);
    EXPECT_EQ(captured.next, -1);
    EXPECT_EQ(op(slots, nullptr).out, -1);  // the capture named nothing
    const auto bf16 = op(slots, nullptr, /*use_fp8=*/false);
    EXPECT_EQ(bf16.out, -1);  // BF16 outputs are tensors of their own
    EXPECT_GE(bf16.next, 0);  // but it names a slot for the next op
    const auto off = op(slots, nullptr, true, false, /*direct=*/false);
    EXPECT_EQ(off.out, -1);
    EXPECT_EQ(off.next, -1);
}

TEST(EpDirectSlots, TheSlotNamedForAnOpIsNotNamedForTheNextEvenWhenUnused) {
    // A BF16 op (or a capture) after an op that named slot s: s may still be
    // written by that op's senders, so the next name must differ.
    EpDirectSlots slots;
    op(slots, nullptr);  // names 0
    const auto bf16 = op(slots, nullptr, /*use_fp8=*/false);
    EXPECT_EQ(bf16.out, -1);
    EXPECT_NE(bf16.next, 0);
}

}  // namespace
}  // namespace mooncake::ep
