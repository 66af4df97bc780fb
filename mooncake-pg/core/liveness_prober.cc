#include "mooncake-pg/core/liveness_prober.h"

#include <utility>

namespace mooncake::pg {

LivenessProber::LivenessProber(int size, std::function<void(int)> probe)
    : probe_(std::move(probe)), wanted_(static_cast<size_t>(size), 0), thread_([this] { run(); }) {}

LivenessProber::~LivenessProber() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void LivenessProber::request(int peer) {
    if (peer < 0 || static_cast<size_t>(peer) >= wanted_.size())
        return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (wanted_[peer] != 0)
            return;
        wanted_[peer] = 1;
    }
    cv_.notify_one();
}

void LivenessProber::run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        cv_.wait(lock, [&] {
            if (stop_)
                return true;
            for (uint8_t w : wanted_) {
                if (w != 0)
                    return true;
            }
            return false;
        });
        if (stop_)
            return;
        for (size_t p = 0; p < wanted_.size() && !stop_; ++p) {
            if (wanted_[p] == 0)
                continue;
            lock.unlock();
            probe_(static_cast<int>(p));
            lock.lock();
            wanted_[p] = 0;
        }
    }
}

}  // namespace mooncake::pg
