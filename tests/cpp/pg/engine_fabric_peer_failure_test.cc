// EngineFabric over tcp: a failed write is evidence about its own peer only.
// Three fabrics share this process, each on an engine of its own that
// reaches the others through tcp; rank 2's engine goes away, and rank 0's
// writes to rank 1 must keep working while those to rank 2 fail.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {
namespace {

constexpr int kRanks = 3;
constexpr size_t kWindow = 1 << 20;

struct TcpGroup {
    std::vector<std::shared_ptr<te::TransferEngine>> engines;
    std::vector<std::shared_ptr<EngineFabric>> fabrics;
};

TcpGroup makeTcpGroup(const std::shared_ptr<KVStore>& store) {
    TcpGroup g;
    for (int r = 0; r < kRanks; ++r) {
        te::EngineOptions eo;
        eo.store = store;
        eo.segment_name = "peerfail/rank" + std::to_string(r);
        eo.secret = "peer-failure-test";
        eo.key_prefix = "peerfail/te";
        eo.force_tcp = true;  // no shared-memory shortcut between the ranks
        auto engine = std::make_shared<te::TransferEngine>(eo);
        Status st = engine->init("127.0.0.1", {});
        EXPECT_TRUE(st.ok()) << st.toString();
        g.engines.push_back(engine);
    }
    std::vector<std::future<Result<std::shared_ptr<EngineFabric>>>> futures;
    for (int r = 0; r < kRanks; ++r) {
        EngineFabricOptions o;
        o.rank = r;
        o.size = kRanks;
        o.window_bytes = kWindow;
        o.group_key = "peerfail";
        o.bootstrap_timeout_ms = 10000;
        o.engine = g.engines[r];
        futures.push_back(
            std::async(std::launch::async, [store, o] { return EngineFabric::create(store, o); }));
    }
    for (auto& f : futures) {
        auto made = f.get();
        EXPECT_TRUE(made.ok()) << made.status().toString();
        g.fabrics.push_back(made.ok() ? made.value() : nullptr);
    }
    return g;
}

TEST(EngineFabricPeerFailure, AFailedWriteToOnePeerDoesNotFailPutsToAnother) {
    auto store = std::make_shared<InProcessKVStore>();
    TcpGroup g = makeTcpGroup(store);
    ASSERT_TRUE(g.fabrics[0] && g.fabrics[1] && g.fabrics[2]);
    EngineFabric& f0 = *g.fabrics[0];
    ASSERT_EQ(f0.peerWindow(1), nullptr) << "the test needs rank 1 reached over tcp";
    ASSERT_EQ(f0.peerWindow(2), nullptr) << "the test needs rank 2 reached over tcp";

    // Rank 2 goes away: its fabric and its engine.
    g.fabrics[2].reset();
    g.engines[2]->shutdown();

    std::vector<uint8_t> data(4096);
    const Deadline deadline = Deadline::after(std::chrono::seconds(30));
    uint64_t round = 0;
    // Writes to rank 2 fail once they complete; whichever put reaps them,
    // only rank 2 is marked and only puts to rank 2 fail.
    while (!f0.peerFailed(2)) {
        ASSERT_FALSE(deadline.expired()) << "no write to the dead rank 2 ever failed";
        ++round;
        (void)f0.put(2, 0, data.data(), data.size(), deadline);
        std::memset(data.data(), static_cast<int>(round & 0xff), data.size());
        Status st = f0.put(1, 0, data.data(), data.size(), deadline);
        ASSERT_TRUE(st.ok()) << "a put to the healthy rank 1 failed: " << st.toString();
        st = f0.putFlag(1, 8192, round, deadline);
        ASSERT_TRUE(st.ok()) << "a flag to the healthy rank 1 failed: " << st.toString();
    }
    EXPECT_EQ(f0.put(2, 0, data.data(), data.size(), deadline).code(), StatusCode::kPeerFailure);
    EXPECT_FALSE(f0.peerFailed(1));

    // The last round's bytes reach rank 1 whole: its flag lands after them.
    const uint8_t* w1 = g.fabrics[1]->localWindow();
    while (__atomic_load_n(reinterpret_cast<const uint64_t*>(w1 + 8192), __ATOMIC_ACQUIRE) !=
           round) {
        ASSERT_FALSE(deadline.expired()) << "the last flag to rank 1 never arrived";
        std::this_thread::yield();
    }
    EXPECT_EQ(std::memcmp(w1, data.data(), data.size()), 0);
    g.fabrics.clear();
}

// put() over tcp only queues; flush() returns once the bytes are in the
// peer's window, so a call may return and its process exit right after.
TEST(EngineFabricFlush, ReturnsOnceEveryQueuedWriteLanded) {
    auto store = std::make_shared<InProcessKVStore>();
    TcpGroup g = makeTcpGroup(store);
    ASSERT_TRUE(g.fabrics[0] && g.fabrics[1] && g.fabrics[2]);
    EngineFabric& f0 = *g.fabrics[0];
    ASSERT_EQ(f0.peerWindow(1), nullptr) << "the test needs rank 1 reached over tcp";
    const Deadline deadline = Deadline::after(std::chrono::seconds(30));
    std::vector<uint8_t> data(kWindow / 2);
    for (int round = 1; round <= 5; ++round) {
        for (size_t i = 0; i < data.size(); ++i)
            data[i] = static_cast<uint8_t>(i * 131 + round);
        for (int peer : {1, 2}) {
            ASSERT_TRUE(f0.put(peer, 0, data.data(), data.size(), deadline).ok());
            ASSERT_TRUE(f0.putFlag(peer, kWindow - 8, round, deadline).ok());
        }
        ASSERT_TRUE(f0.flush(deadline));
        // No waiting here: flush() already did.
        for (int peer : {1, 2}) {
            const uint8_t* w = g.fabrics[peer]->localWindow();
            EXPECT_EQ(std::memcmp(w, data.data(), data.size()), 0) << "round " << round;
            EXPECT_EQ(__atomic_load_n(reinterpret_cast<const uint64_t*>(w + kWindow - 8),
                                      __ATOMIC_ACQUIRE),
                      static_cast<uint64_t>(round));
        }
    }
    g.fabrics.clear();
}

}  // namespace
}  // namespace mooncake::pg
