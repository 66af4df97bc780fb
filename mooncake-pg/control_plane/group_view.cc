#include "mooncake-pg/control_plane/group_view.h"

namespace mooncake::pg::control_plane {

std::vector<int32_t> GroupView::activeMask() const {
    std::vector<int32_t> mask(slots.size(), 0);
    for (size_t r = 0; r < slots.size(); ++r) {
        if (slots[r].member == GroupMemberState::kActive)
            mask[r] = 1;
    }
    return mask;
}

std::vector<uint32_t> GroupView::activeRanks() const {
    std::vector<uint32_t> ranks;
    for (size_t r = 0; r < slots.size(); ++r) {
        if (slots[r].member == GroupMemberState::kActive)
            ranks.push_back(static_cast<uint32_t>(r));
    }
    return ranks;
}

int32_t GroupView::groupSize() const {
    return groupSizeFromMask(activeMask());
}

ViewUpdate GroupView::toMessage() const {
    ViewUpdate v;
    v.revision = revision;
    v.bootstrapped = bootstrapped;
    v.slots = slots;
    return v;
}

int32_t groupSizeFromMask(const std::vector<int32_t>& active_mask) {
    for (size_t r = active_mask.size(); r > 0; --r) {
        if (active_mask[r - 1] != 0)
            return static_cast<int32_t>(r);
    }
    return 0;
}

}  // namespace mooncake::pg::control_plane
