// LivenessProber: asks, off the waiting threads, whether peers are alive.
// Waiters poll Fabric::peerFailed in spin loops; a probe of a peer on another
// host is a network round trip, so peerFailed only requests one here and
// answers from what earlier probes found. One thread serves every request.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

class LivenessProber {
public:
    // `probe(peer)` checks one peer and may block up to its own deadline;
    // a kPeerFailure result means the peer is dead (any other error, a
    // timeout included, proves nothing) and `on_dead(peer)` is called.
    LivenessProber(int size, std::function<Status(int)> probe, std::function<void(int)> on_dead);
    ~LivenessProber();  // joins the thread; a probe in progress finishes first
    LivenessProber(const LivenessProber&) = delete;
    LivenessProber& operator=(const LivenessProber&) = delete;

    // Queues a probe of `peer` unless one is already queued; never blocks on
    // the probe itself.
    void request(int peer);
    // Probes that reported a peer dead, for tests and logs.
    uint64_t deathsFound() const;

private:
    void run();

    const std::function<Status(int)> probe_;
    const std::function<void(int)> on_dead_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<uint8_t> wanted_;  // by rank
    bool stop_ = false;
    uint64_t deaths_ = 0;
    std::thread thread_;
};

}  // namespace mooncake::pg
