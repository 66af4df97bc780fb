// A rank that exits (or is killed) right after its call completed must not
// take its part of the call with it. Over tcp, puts only queue their bytes,
// so a call flushes them before it returns (Fabric::flush). Here rank 2's
// puts reach the others only after a lag, through a queue that its "death"
// drops, as a killed process drops what its transport had not sent.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

using testutil::ForwardingFabric;
using testutil::Mapping;
using testutil::MappingFabric;

// Delivers puts and flags in issue order on a thread of its own, each no
// sooner than `lag` after it was issued.
class LaggingFabric : public ForwardingFabric {
public:
    LaggingFabric(std::shared_ptr<Fabric> inner, std::chrono::milliseconds lag)
        : ForwardingFabric(std::move(inner)), lag_(lag), delivery_([this] { deliver(); }) {}
    ~LaggingFabric() override { drop(); }

    Status put(int peer, uint64_t offset, const void* src, size_t len, Deadline) override {
        const auto* bytes = static_cast<const uint8_t*>(src);
        enqueue(Pending{peer, offset, std::vector<uint8_t>(bytes, bytes + len), false, 0, {}});
        return Status::OK();
    }
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline) override {
        enqueue(Pending{peer, offset, {}, true, value, {}});
        return Status::OK();
    }
    uint8_t* peerWindow(int) override { return nullptr; }
    bool flush(Deadline deadline) override {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_until(lock, deadline.at(), [&] { return queue_.empty() && !busy_; });
    }

    // The process dies: what is still queued is lost.
    void drop() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopped_ = true;
            queue_.clear();
        }
        cv_.notify_all();
        if (delivery_.joinable())
            delivery_.join();
    }

private:
    struct Pending {
        int peer;
        uint64_t offset;
        std::vector<uint8_t> bytes;
        bool is_flag;
        uint64_t value;
        std::chrono::steady_clock::time_point due;
    };

    void enqueue(Pending p) {
        p.due = std::chrono::steady_clock::now() + lag_;
        {
            std::lock_guard<std::mutex> lock(mu_);
            queue_.push_back(std::move(p));
        }
        cv_.notify_all();
    }

    void deliver() {
        std::unique_lock<std::mutex> lock(mu_);
        while (true) {
            cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
            if (stopped_)
                return;
            const auto due = queue_.front().due;
            if (cv_.wait_until(lock, due, [&] { return stopped_; }))
                return;
            Pending p = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
            lock.unlock();
            Status st = p.is_flag ? inner().putFlag(p.peer, p.offset, p.value, testutil::generous())
                                  : inner().put(p.peer, p.offset, p.bytes.data(), p.bytes.size(),
                                                testutil::generous());
            EXPECT_TRUE(st.ok()) << st.toString();
            lock.lock();
            busy_ = false;
            cv_.notify_all();
        }
    }

    std::chrono::milliseconds lag_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
    bool busy_ = false;
    bool stopped_ = false;
    std::thread delivery_;  // last: starts once the members above exist
};

// A one-round call: the victim has everything it needs the moment the others'
// messages arrive, while its own is still queued. (In a call of several
// rounds the others' last messages wait for the victim's earlier ones, so its
// last one, queued before, has usually landed by the time it finishes.)
TEST(CollectivesExit, RankKilledRightAfterItsCallCompletedStillDeliveredItsPart) {
    constexpr int kRanks = 3;
    constexpr int kVictim = 2;
    constexpr size_t count = 3;
    const CommOptions options = testutil::smallOptions();
    ThreadFabricGroup group(kRanks, Communicator::windowBytesFor(kRanks, options));
    // No rank reads another's window in place: every byte travels by put,
    // as between hosts.
    std::vector<std::unique_ptr<Communicator>> comms;
    std::shared_ptr<LaggingFabric> victim;
    for (int r = 0; r < kRanks; ++r) {
        std::shared_ptr<Fabric> fabric =
            std::make_shared<MappingFabric>(group.fabric(r), Mapping::kNone);
        if (r == kVictim) {
            victim = std::make_shared<LaggingFabric>(fabric, std::chrono::milliseconds(20));
            fabric = victim;
        }
        comms.push_back(std::make_unique<Communicator>(fabric, options));
    }
    std::vector<Status> results(kRanks);
    std::vector<std::vector<int32_t>> values(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, r] {
            values[r].assign(count, r + 1);
            results[r] =
                comms[r]->allReduce(values[r].data(), values[r].data(), count, DataType::kInt32,
                                    ReduceOp::kSum, Deadline::after(std::chrono::seconds(20)));
            if (r == kVictim) {
                // Dies the moment its call returns.
                victim->drop();
                group.kill(kVictim);
            }
        });
    }
    for (auto& t : threads)
        t.join();
    for (int r = 0; r < kRanks; ++r) {
        ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].toString();
        for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(values[r][i], 6) << "rank " << r << " element " << i;
    }
}

}  // namespace
}  // namespace mooncake::pg
