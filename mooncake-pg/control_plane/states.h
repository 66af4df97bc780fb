// The two state axes of the elastic-membership model.
//
// A group has max_group_size numbered slots ("seats") that are never
// renumbered. Each slot has a group-level GroupMemberState (is the slot part of
// the communicating set?) and, when a process sits in it, a process-level
// RankState (is that process alive and connected?). The two are independent:
// an Active member can be Offline after failure reconciliation in
// framework-managed mode, and a Healthy process can be Inactive while it warms
// up.
#pragma once

#include <cstdint>
#include <optional>

namespace mooncake::pg::control_plane {

// Process-level liveness of the process currently sitting in a slot.
enum class RankState : uint8_t {
    kOffline = 0,  // no process, it left, or reconciliation found it unreachable
    kSynced = 1,   // registered with the Coordinator, not yet proven connected
    kHealthy = 2,  // proven bidirectionally connected to the group
};

// Group-level membership of a slot.
enum class GroupMemberState : uint8_t {
    kNone = 0,                // never used (reserved capacity)
    kInactive = 1,            // a process is registered but does not participate
    kAwaitingActivation = 2,  // the process called join_group and waits
    kActive = 3,              // participates in collectives; counted in the size
    kLeft = 4,                // the process left; the slot may be reused
};

const char* rankStateName(RankState s);
const char* groupMemberStateName(GroupMemberState s);

// Wire decoding: nullopt for values no version of the protocol defines.
std::optional<RankState> rankStateFromWire(uint8_t v);
std::optional<GroupMemberState> groupMemberStateFromWire(uint8_t v);

}  // namespace mooncake::pg::control_plane
