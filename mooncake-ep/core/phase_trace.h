// Optional timestamps of the EP kernels' blocks, for benchmarks
// (ep_benchmark --phase-trace) and the tests that check them: where an
// operation's time goes, on one timeline for every process of a GPU (the
// GPU's %globaltimer, in ns).
//
// EpGroupArgs::phase_trace is null (no tracing: one untaken branch per mark)
// or a device array of kEpTraceSlots words. Thread 0 of block b of kernel k
// writes mark m to epTraceSlot(k, b, m); blocks at or past kEpTraceMaxBlocks
// write nothing, and a send block to an inactive rank only its start, so a
// slot still 0 means "no such mark". Marks:
//   start   the block began;
//   middle  a send block wrote its data (its signal comes next); a receive
//           block finished its first wait (the counts of its first expert,
//           the flags of its first token);
//   end     the block is done (after its last barrier).
#pragma once

#include <cstdint>

#include "mooncake-ep/core/host_device.h"

namespace mooncake::ep {

enum EpTraceKernel : int {
    kEpTraceDispatchSend = 0,
    kEpTraceDispatchReceive = 1,
    kEpTraceCombineSend = 2,
    kEpTraceCombineReceive = 3,
    kEpTraceKernels = 4,
};

enum EpTraceMark : int {
    kEpTraceStart = 0,
    kEpTraceMiddle = 1,
    kEpTraceEnd = 2,
    kEpTraceMarks = 3,
};

// Grids are at most num_experts (send) or the token / local-expert count
// (receive) blocks: 4096 covers the benchmarks' settings.
inline constexpr int kEpTraceMaxBlocks = 4096;
inline constexpr int64_t kEpTraceSlots =
    int64_t{kEpTraceKernels} * kEpTraceMaxBlocks * kEpTraceMarks;

MC_EP_HD constexpr int64_t epTraceSlot(int kernel, int block, int mark) {
    return (static_cast<int64_t>(kernel) * kEpTraceMaxBlocks + block) * kEpTraceMarks + mark;
}

}  // namespace mooncake::ep
