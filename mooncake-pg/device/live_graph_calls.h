// How many of a group's captured calls sit in CUDA graphs that still exist.
//
// A replay runs without the host, so the group's worker watches for dead
// peers on its behalf (MooncakeBackend::watchGraphReplays) for as long as a
// graph holding one of its calls can still be replayed. CUDA says when that
// ends through a user object the graph owns: it is released once the graph
// and every executable instantiated from it are destroyed and their pending
// launches have finished, and its destructor gives the count back.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace mooncake::pg::device {

class LiveGraphCalls {
public:
    LiveGraphCalls();

    // Counts one more call captured into the graph that `stream` is being
    // captured into, until that graph is gone. Where CUDA cannot tie it to
    // the graph (no capture, a failed call), the count is never given back:
    // the group then watches for as long as it lives, which is safe.
    void holdUntilGraphDestroyed(cudaStream_t stream);

    // Any thread. The destructor runs on a CUDA thread, so this may lag the
    // last cudaGraphExecDestroy a little.
    int64_t count() const { return count_->load(std::memory_order_acquire); }

private:
    // Shared with the destructors still pending, which may outlive the group.
    std::shared_ptr<std::atomic<int64_t>> count_;
};

}  // namespace mooncake::pg::device
