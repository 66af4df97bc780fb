// A point in steady time after which a wait gives up. Every blocking call in
// the project takes one; Deadline::never() exists for tests and shutdown only.
#pragma once

#include <chrono>
#include <cstdint>

namespace mooncake {

class Deadline {
public:
    using Clock = std::chrono::steady_clock;

    static Deadline after(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
    static Deadline afterMs(int64_t ms) { return after(std::chrono::milliseconds(ms)); }
    static Deadline never() { return Deadline(Clock::time_point::max()); }

    bool expired() const { return Clock::now() >= at_; }
    Clock::time_point at() const { return at_; }
    // Milliseconds left, clamped to [0, INT32_MAX] for poll()/epoll_wait().
    int remainingMsForPoll() const;
    std::chrono::nanoseconds remaining() const;

private:
    explicit Deadline(Clock::time_point at) : at_(at) {}
    Clock::time_point at_;
};

inline std::chrono::nanoseconds Deadline::remaining() const {
    if (at_ == Clock::time_point::max()) return std::chrono::nanoseconds::max();
    auto now = Clock::now();
    return now >= at_ ? std::chrono::nanoseconds(0) : at_ - now;
}

inline int Deadline::remainingMsForPoll() const {
    if (at_ == Clock::time_point::max()) return -1;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(remaining()).count();
    if (ms > INT32_MAX) return INT32_MAX;
    // Round a sub-millisecond remainder up so we do not spin on poll(0).
    if (ms == 0 && !expired()) return 1;
    return static_cast<int>(ms);
}

}  // namespace mooncake
