// What a group keeps about its collectives captured in CUDA graphs
// (cuda_collectives.cc, cuda_pipeline.cc). Replays run unseen by the host,
// so the idle worker watches them while a graph holding one of the group's
// captured calls exists (MooncakeBackend::watchGraphReplays).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "mooncake-pg/device/device_group.h"

namespace mooncake::pg {

namespace device {
class LiveGraphCalls;
}  // namespace device

struct GraphWatch {
    std::atomic<uint64_t> captured_calls{0};
    // Set by configureCuda on CUDA builds; shared with CUDA's destructors of
    // the graphs' user objects, which may run after the group is gone.
    std::shared_ptr<device::LiveGraphCalls> live_calls;
    std::atomic<uint64_t> passes{0};
    // Set by the worker when it queues a captured call; cleared by a watch
    // pass that began with no graph alive, which reports what the last
    // replays left in the graph result. Read by tests (graphWatchIdle).
    std::atomic<bool> owed{false};
    // A failed replay's evidence, for the control plane.
    struct Failure {
        device::DeviceOpResult result;
        uint64_t epoch = 0;  // applied when it was found
    };
    std::mutex mu;  // guards the graph result's reads and clears, and the two below
    // The failure standing in the graph result was reported, handed over by
    // checkGraphReplays, or happened in a view since replaced.
    bool failure_taken = false;
    // Cleared by checkGraphReplays before the worker took it: for the worker.
    std::optional<Failure> evidence;
    // Worker thread: the abort reason watchGraphReplays last set.
    uint64_t abort_reason = 0;
    std::atomic<uint64_t> failures_reported{0};
};

}  // namespace mooncake::pg
