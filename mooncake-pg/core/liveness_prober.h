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

namespace mooncake::pg {

class LivenessProber {
public:
    // `probe(peer)` checks one peer and acts on the answer (marks it failed);
    // it may block up to its own deadline.
    LivenessProber(int size, std::function<void(int)> probe);
    ~LivenessProber();  // joins the thread; a probe in progress finishes first
    LivenessProber(const LivenessProber&) = delete;
    LivenessProber& operator=(const LivenessProber&) = delete;

    // Queues a probe of `peer` unless one is already queued; never blocks on
    // the probe itself.
    void request(int peer);

private:
    void run();

    const std::function<void(int)> probe_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<uint8_t> wanted_;  // by rank
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace mooncake::pg
