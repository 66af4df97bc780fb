// Direct FP8 dispatch (trial, MC_EP_DIRECT_DISPATCH=1; docs/ep-guide.md):
// senders write their rows straight into the owner's packed receive area
// (EpLayout::direct*), each (sender, expert) at a range it reserves on the
// owner's per-expert row counter, so the receive copies nothing.
//
// A counter is one u64: the low 32 bits of the op's sequence number above the
// rows reserved so far. A counter tagged with an older op reads as zero rows
// (no reset needed between ops), one tagged with a newer op refuses: a
// sender that stalled past its op's deadline must not take rows of the op
// after next, which uses the same half. Rows reserved by a sender whose
// count never arrives are a hole: the receive marks them (src_info -1).
#pragma once

#include <cstdint>

#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"

namespace mooncake::ep {

// A refused reservation (see above); also what the sender reports as its base.
inline constexpr uint32_t kEpDirectRefused = 0xfffffffeu;
// A reservation word some block of this grid is filling in.
inline constexpr uint32_t kEpDirectPending = 0xffffffffu;

// Reserves `rows` rows of op `seq` on `counter` (the owner's, mapped here;
// system scope: peers on other GPUs add to it too). Returns the first, or
// kEpDirectRefused.
__device__ inline uint32_t epDirectReserve(uint64_t* counter, uint64_t seq, uint32_t rows) {
    auto* word = reinterpret_cast<unsigned long long*>(counter);
    const uint32_t tag = static_cast<uint32_t>(seq);
    unsigned long long v = *reinterpret_cast<volatile unsigned long long*>(word);
    for (;;) {
        const int32_t age = static_cast<int32_t>(static_cast<uint32_t>(v >> 32) - tag);
        if (age > 0)
            return kEpDirectRefused;
        const uint32_t used = age == 0 ? static_cast<uint32_t>(v) : 0;
        const unsigned long long next =
            (static_cast<unsigned long long>(tag) << 32) | (used + rows);
        const unsigned long long seen = atomicCAS_system(word, v, next);
        if (seen == v)
            return used;
        v = seen;
    }
}

}  // namespace mooncake::ep
