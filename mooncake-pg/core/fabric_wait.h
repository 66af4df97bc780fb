// waitFlag: the one place the core waits on memory another rank writes.
#pragma once

#include <sched.h>

#include <chrono>
#include <string>
#include <thread>

namespace mooncake::pg {

template <typename Pred>
Status waitFlag(Fabric& fabric, uint64_t offset, Pred pred, Deadline deadline, int peer) {
    // Spinning keeps small-message latency low when a core is free; with more
    // ranks than cores, yielding and then sleeping lets the writer run.
    constexpr int kSpinIterations = 2000;
    constexpr int kYieldIterations = 200;
    constexpr auto kMaxSleep = std::chrono::microseconds(50);
    const uint8_t* window = fabric.localWindow();
    auto sleep = std::chrono::microseconds(2);
    for (uint64_t i = 0;; ++i) {
        if (pred(loadFlag(window, offset))) return Status::OK();
        if ((i & 63) == 0) {
            if (peer >= 0 && fabric.peerFailed(peer)) {
                // What it wrote before it failed stands: a rank killed right
                // after its call completed flushed its part first, and that
                // may have landed since the load above.
                if (pred(loadFlag(window, offset)))
                    return Status::OK();
                return PeerFailure("rank " + std::to_string(peer) + " failed");
            }
            if (deadline.expired()) {
                return Timeout(peer >= 0 ? "waiting for rank " + std::to_string(peer)
                                         : std::string("waiting for peers"));
            }
        }
        if (i < kSpinIterations) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        } else if (i < kSpinIterations + kYieldIterations) {
            sched_yield();
        } else {
            fabric.waitHint();
            std::this_thread::sleep_for(sleep);
            if (sleep < kMaxSleep) sleep *= 2;
        }
    }
}

}  // namespace mooncake::pg
