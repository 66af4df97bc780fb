// The members' own buffers of one call, mapped in this process: what the
// direct collectives read and write instead of staging through the windows.
// Plain types (shared by host code and kernels, passed by value).
#pragma once

#include <cstdint>

#include "mooncake-pg/device/device_group.h"

namespace mooncake::pg::device {

// Steps of a direct call (step_kernel.cuh): 0 signals the inputs ready,
// the kernel after it does the call's reads and writes and signals them
// done, and the kernels after it wait until every member is done with this
// rank's buffers. Step 2 moves nothing; it is there because a call's steps
// must be odd, so that the next call's flags land on the other parity.
inline constexpr uint64_t kDirectSteps = 3;

struct MemberBuffers {
    // Indexed by rank; this rank's entries are its own pointers.
    const void* inputs[kMaxDeviceRanks] = {};
    void* outputs[kMaxDeviceRanks] = {};
};

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool rangesOverlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
    const auto* x = static_cast<const char*>(a);
    const auto* y = static_cast<const char*>(b);
    return x < y + b_bytes && y < x + a_bytes;
}

// Whether [a, a + bytes) and [b, b + bytes) share a byte.
inline bool bytesOverlap(const void* a, const void* b, uint64_t bytes) {
    return rangesOverlap(a, bytes, b, bytes);
}

// The members' input addresses or-ed together: their common alignment.
inline uintptr_t inputAddressBits(const MemberBuffers& b, int size) {
    uintptr_t bits = 0;
    for (int r = 0; r < size; ++r)
        bits |= reinterpret_cast<uintptr_t>(b.inputs[r]);
    return bits;
}

// The same for the members' outputs.
inline uintptr_t outputAddressBits(const MemberBuffers& b, int size) {
    uintptr_t bits = 0;
    for (int r = 0; r < size; ++r)
        bits |= reinterpret_cast<uintptr_t>(b.outputs[r]);
    return bits;
}

}  // namespace mooncake::pg::device
