// The members' own buffers of one call, mapped in this process: what the
// direct collectives read and write instead of staging through the windows.
// Plain types (shared by host code and kernels, passed by value).
#pragma once

#include "mooncake-pg/device/device_group.h"

namespace mooncake::pg::device {

struct MemberBuffers {
    // Indexed by rank; this rank's entries are its own pointers.
    const void* inputs[kMaxDeviceRanks] = {};
    void* outputs[kMaxDeviceRanks] = {};
};

}  // namespace mooncake::pg::device
