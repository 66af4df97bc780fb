// The membership table as members see it: one SlotInfo per slot plus the two
// counters that order views. `epoch` changes exactly when the active set
// changes (it fences data-plane traffic and evidence); `revision` changes with
// any field (a join request, a published endpoint, a health change).
#pragma once

#include <cstdint>
#include <vector>

#include "mooncake-pg/control_plane/messages.h"

namespace mooncake::pg::control_plane {

struct GroupView {
    uint64_t epoch = 0;
    uint64_t revision = 0;
    bool bootstrapped = false;
    std::vector<SlotInfo> slots;  // max_group_size entries

    bool isActive(uint32_t rank) const {
        return rank < slots.size() && slots[rank].member == GroupMemberState::kActive;
    }
    // 1 for Active slots, 0 otherwise; what get_active_ranks returns.
    std::vector<int32_t> activeMask() const;
    std::vector<uint32_t> activeRanks() const;
    // Highest Active rank + 1 (holes below it count); 0 when none is Active.
    int32_t groupSize() const;

    ViewUpdate toMessage() const;
};

int32_t groupSizeFromMask(const std::vector<int32_t>& active_mask);

}  // namespace mooncake::pg::control_plane
