#include "mooncake-pg/control_plane/states.h"

namespace mooncake::pg::control_plane {

const char* rankStateName(RankState s) {
    switch (s) {
        case RankState::kOffline:
            return "Offline";
        case RankState::kSynced:
            return "Synced";
        case RankState::kHealthy:
            return "Healthy";
    }
    return "Unknown";
}

const char* groupMemberStateName(GroupMemberState s) {
    switch (s) {
        case GroupMemberState::kNone:
            return "None";
        case GroupMemberState::kInactive:
            return "Inactive";
        case GroupMemberState::kAwaitingActivation:
            return "AwaitingActivation";
        case GroupMemberState::kActive:
            return "Active";
        case GroupMemberState::kLeft:
            return "Left";
    }
    return "Unknown";
}

std::optional<RankState> rankStateFromWire(uint8_t v) {
    if (v > static_cast<uint8_t>(RankState::kHealthy))
        return std::nullopt;
    return static_cast<RankState>(v);
}

std::optional<GroupMemberState> groupMemberStateFromWire(uint8_t v) {
    if (v > static_cast<uint8_t>(GroupMemberState::kLeft))
        return std::nullopt;
    return static_cast<GroupMemberState>(v);
}

}  // namespace mooncake::pg::control_plane
