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

// Queues the wait on `stream`; kInvalidArgument unless 0 < min_ns and
// 0 < period_ns, kInternal when the launch fails.
Status launchAlignedPad(uint64_t min_ns, uint64_t period_ns, cudaStream_t stream);

// A wait that ends when the GPU's clock reaches `target_ns`, the same
// instant for every process on this GPU once they agree on the target (one
// reads the clock, launchReadGpuClock, adds a margin and tells the others;
// processes on other GPUs have other clocks):
// unlike a period, no rank can land one period later than the others. It
// never waits longer than `max_wait_ns` (a target from another GPU's clock
// could be far off); kInvalidArgument for 0.
Status launchPadUntil(uint64_t target_ns, uint64_t max_wait_ns, cudaStream_t stream);
// Writes the GPU's clock (%globaltimer, ns) into the device word `out`.
Status launchReadGpuClock(uint64_t* out, cudaStream_t stream);

}  // namespace mooncake::ep
