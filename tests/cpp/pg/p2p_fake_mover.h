// A P2PMover for tests of the external-pool mode (p2p_mover.h): receive
// pools in host memory shared by the ranks of a test group, and per rank a
// copy thread that runs the queued copies in order, as a copy engine would.
// Copies can be held (queued but not run), made to fail, and counted, so a
// test can observe what an engine does while its copies are in flight.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/core/p2p_mover.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg::p2p_test {

// An op's order that a test opens when it likes (the stand-in for a
// producer kernel still running on the caller's stream).
struct Gate : P2POrder {
    std::atomic<bool> open{false};
};

// Receive pools of every rank: rank `owner` keeps one pool per sender.
class FakePools {
public:
    FakePools(int ranks, size_t pool_bytes)
        : ranks_(ranks),
          pool_bytes_(pool_bytes),
          memory_(static_cast<size_t>(ranks) * ranks * pool_bytes, 0) {}
    uint8_t* pool(int owner, int sender) {
        return memory_.data() + (static_cast<size_t>(owner) * ranks_ + sender) * pool_bytes_;
    }
    size_t poolBytes() const { return pool_bytes_; }

private:
    int ranks_;
    size_t pool_bytes_;
    std::vector<uint8_t> memory_;
};

class FakeMover : public P2PMover {
public:
    FakeMover(std::shared_ptr<FakePools> pools, int rank)
        : pools_(std::move(pools)), rank_(rank), thread_([this] { run(); }) {}
    ~FakeMover() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
            held_ = false;
        }
        cv_.notify_all();
        thread_.join();
    }

    Result<uint64_t> put(int peer, uint64_t pool_offset, const void* src, size_t bytes,
                         const P2POrder* order) override {
        MC_RETURN_IF_ERROR(checkInPool(pool_offset, bytes));
        return queue(pools_->pool(peer, rank_) + pool_offset, static_cast<const uint8_t*>(src),
                     bytes, order);
    }
    Result<uint64_t> take(int peer, uint64_t pool_offset, void* dst, size_t bytes,
                          const P2POrder* order) override {
        MC_RETURN_IF_ERROR(checkInPool(pool_offset, bytes));
        return queue(static_cast<uint8_t*>(dst), pools_->pool(rank_, peer) + pool_offset, bytes,
                     order);
    }
    bool ready(const P2POrder* order) override {
        const auto* gate = dynamic_cast<const Gate*>(order);
        return gate == nullptr || gate->open.load();
    }
    Result<bool> completed(uint64_t ticket) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (broken_)
            return Internal("fake mover: the copy queue is broken");
        return ran_ >= ticket;
    }
    Status drain(Deadline deadline) override {
        std::unique_lock<std::mutex> lock(mu_);
        ++drains_;
        cv_.notify_all();
        if (!cv_.wait_until(lock, deadline.at(), [this] { return ran_ == queued_; }))
            return Timeout("fake mover: copies still queued");
        return Status::OK();
    }

    // Queued copies wait until release().
    void hold() {
        std::lock_guard<std::mutex> lock(mu_);
        held_ = true;
    }
    void release() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            held_ = false;
        }
        cv_.notify_all();
    }
    // completed() fails from now on.
    void breakQueue() {
        std::lock_guard<std::mutex> lock(mu_);
        broken_ = true;
    }
    uint64_t queued() const {
        std::lock_guard<std::mutex> lock(mu_);
        return queued_;
    }
    uint64_t ran() const {
        std::lock_guard<std::mutex> lock(mu_);
        return ran_;
    }
    int drains() const {
        std::lock_guard<std::mutex> lock(mu_);
        return drains_;
    }
    // The order each copy was queued with, in queue order.
    std::vector<const P2POrder*> orders() const {
        std::lock_guard<std::mutex> lock(mu_);
        return orders_;
    }

private:
    struct Copy {
        uint8_t* dst;
        const uint8_t* src;
        size_t bytes;
    };

    // Every copy must stay inside its pool: the engine computes offsets
    // from credits a peer wrote.
    Status checkInPool(uint64_t offset, size_t bytes) const {
        EXPECT_LE(offset + bytes, pools_->poolBytes());
        if (offset + bytes > pools_->poolBytes())
            return InvalidArgument("fake mover: copy outside the pool");
        return Status::OK();
    }

    Result<uint64_t> queue(uint8_t* dst, const uint8_t* src, size_t bytes, const P2POrder* order) {
        std::lock_guard<std::mutex> lock(mu_);
        orders_.push_back(order);
        copies_.push_back(Copy{dst, src, bytes});
        cv_.notify_all();
        return ++queued_;
    }

    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        while (true) {
            cv_.wait(lock, [this] { return stop_ || (!held_ && !copies_.empty()); });
            if (copies_.empty())
                return;
            Copy c = copies_.front();
            copies_.pop_front();
            lock.unlock();
            std::memcpy(c.dst, c.src, c.bytes);
            lock.lock();
            ++ran_;
            cv_.notify_all();
        }
    }

    std::shared_ptr<FakePools> pools_;
    const int rank_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Copy> copies_;
    std::vector<const P2POrder*> orders_;
    uint64_t queued_ = 0;
    uint64_t ran_ = 0;
    int drains_ = 0;
    bool held_ = false;
    bool broken_ = false;
    bool stop_ = false;
    std::thread thread_;
};

inline P2POptions externalOptions() {
    P2POptions o = smallOptions();
    o.external_pools = true;
    return o;
}

// Engines in external-pool mode over a ThreadFabricGroup, one FakeMover each.
struct MoverGroup {
    MoverGroup(int n, const P2POptions& o)
        : pools(std::make_shared<FakePools>(n, o.pool_bytes_per_peer)),
          fabrics(n, o.window_offset + P2PEngine::windowBytesFor(n, o)) {
        for (int r = 0; r < n; ++r) {
            movers.push_back(std::make_shared<FakeMover>(pools, r));
            engines.push_back(std::make_unique<P2PEngine>(fabrics.fabric(r), o, movers.back()));
        }
    }
    P2PEngine& operator[](int r) { return *engines[r]; }

    std::shared_ptr<FakePools> pools;
    ThreadFabricGroup fabrics;
    std::vector<std::shared_ptr<FakeMover>> movers;
    std::vector<std::unique_ptr<P2PEngine>> engines;
};

}  // namespace mooncake::pg::p2p_test
