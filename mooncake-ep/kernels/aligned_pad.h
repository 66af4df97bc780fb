// A GPU wait that ends at the same instant for every process on the GPU:
// for benchmarks that time device work alone. Processes sharing a GPU share
// its %globaltimer, so a wait that runs at least `min_ns` and then until the
// next multiple of `period_ns` ends together on every rank that queued it
// within the same period; the work queued behind it then starts together,
// whatever each rank's host lateness was.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

// The most blocks a busy pad may hold (a grid's x limit is far above; more
// than a few per SM serve no purpose).
inline constexpr int kMaxPadBusyBlocks = 65535;

// OK for a busy_blocks argument of the pads below, else kInvalidArgument
// naming the value and the range. Host only, no CUDA call: the torch layer
// checks with it before it asks for a stream.
Status checkPadBusyBlocks(int64_t busy_blocks);

// Queues the wait on `stream`; kInvalidArgument unless 0 < min_ns and
// 0 < period_ns, kInternal when the launch fails. `busy_blocks`: 0 (the
// default) waits in one sleeping thread; N > 0 in N blocks of one warp that
// poll the clock without sleeping, which keep the SMs they hold active, as
// under load (one sleeping thread leaves the GPU nearly idle).
// kInvalidArgument outside [0, kMaxPadBusyBlocks].
Status launchAlignedPad(uint64_t min_ns, uint64_t period_ns, cudaStream_t stream,
                        int busy_blocks = 0);

// A wait that ends when the GPU's clock reaches `target_ns`, the same
// instant for every process on this GPU once they agree on the target (one
// reads the clock, launchReadGpuClock, adds a margin and tells the others;
// processes on other GPUs have other clocks):
// unlike a period, no rank can land one period later than the others. It
// never waits longer than `max_wait_ns` (a target from another GPU's clock
// could be far off); kInvalidArgument for 0. `busy_blocks` as for
// launchAlignedPad.
Status launchPadUntil(uint64_t target_ns, uint64_t max_wait_ns, cudaStream_t stream,
                      int busy_blocks = 0);
// Writes the GPU's clock (%globaltimer, ns) into the device word `out`.
Status launchReadGpuClock(uint64_t* out, cudaStream_t stream);

}  // namespace mooncake::ep
