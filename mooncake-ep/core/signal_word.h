// A signal is one 64-bit word: the low 32 bits of the operation's sequence
// number above a 32-bit payload (a token count, or unused). A wait matches
// the sequence exactly, so a word left by an earlier operation (or the zeroed
// buffer: sequence 0 is never used) cannot satisfy a newer wait, and the
// count arrives in the same store as the release that orders it after the
// data.
#pragma once

#include <cstdint>

#include "mooncake-ep/core/host_device.h"

namespace mooncake::ep {

MC_EP_HD constexpr uint64_t epMakeSignal(uint64_t seq, uint32_t payload) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(seq)) << 32) | payload;
}
MC_EP_HD constexpr bool epSignalMatches(uint64_t word, uint64_t seq) {
    return static_cast<uint32_t>(word >> 32) == static_cast<uint32_t>(seq);
}
MC_EP_HD constexpr uint32_t epSignalPayload(uint64_t word) {
    return static_cast<uint32_t>(word);
}

}  // namespace mooncake::ep
