// SharedEngine and EngineFabric's external-engine option: two "processes"
// (threads with an engine each) on one store agree on the secret, groups
// built on their engines move data, leave the engines running and free
// exactly the memory they took, and the ranks must agree on the choice.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/shared_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {
namespace {

constexpr size_t kWindow = 1 << 20;

std::shared_ptr<SharedEngine> makeEngine(const std::shared_ptr<KVStore>& store,
                                         const std::string& prefix = "te") {
    SharedEngineOptions o;
    o.key_prefix = prefix;
    o.timeout_ms = 5000;
    auto made = SharedEngine::create(store, o);
    EXPECT_TRUE(made.ok()) << made.status().toString();
    return made.ok() ? made.value() : nullptr;
}

// Both ranks' fabrics of group `key` on the given engines, built concurrently.
std::vector<std::shared_ptr<EngineFabric>> makeGroup(
    const std::shared_ptr<KVStore>& store, const std::string& key,
    const std::vector<std::shared_ptr<SharedEngine>>& engines) {
    std::vector<std::future<Result<std::shared_ptr<EngineFabric>>>> futures;
    for (int r = 0; r < 2; ++r) {
        EngineFabricOptions o;
        o.rank = r;
        o.size = 2;
        o.window_bytes = kWindow;
        o.group_key = key;
        o.bootstrap_timeout_ms = 5000;
        auto lease = engines[r]->lease();
        EXPECT_TRUE(lease.ok()) << lease.status().toString();
        o.engine = lease.value();
        futures.push_back(
            std::async(std::launch::async, [store, o] { return EngineFabric::create(store, o); }));
    }
    std::vector<std::shared_ptr<EngineFabric>> fabrics;
    for (auto& f : futures) {
        auto made = f.get();
        EXPECT_TRUE(made.ok()) << made.status().toString();
        fabrics.push_back(made.ok() ? made.value() : nullptr);
    }
    return fabrics;
}

// Rank 0 puts a pattern at an unaligned offset of rank 1's window.
void expectPutArrives(EngineFabric& from, EngineFabric& to, uint8_t seed) {
    std::vector<uint8_t> data(70001);
    for (size_t i = 0; i < data.size(); ++i)
        data[i] = static_cast<uint8_t>(seed + i * 7);
    ASSERT_TRUE(from.put(to.rank(), 13, data.data(), data.size(), Deadline::afterMs(10000)).ok());
    ASSERT_EQ(std::memcmp(to.localWindow() + 13, data.data(), data.size()), 0);
}

size_t localRegions(SharedEngine& e) {
    auto desc = e.engine().segmentDesc(te::kLocalSegment);
    EXPECT_TRUE(desc.ok());
    return desc.ok() ? desc->regions.size() : 0;
}

TEST(SharedEngine, EnginesOfOneStoreAgreeOnTheStoreIdAndOtherPrefixesDiffer) {
    auto store = std::make_shared<InProcessKVStore>();
    auto a = makeEngine(store);
    auto b = makeEngine(store);
    auto c = makeEngine(store, "other");
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(a->storeId(), b->storeId());
    EXPECT_NE(a->storeId(), c->storeId());
    EXPECT_NE(a->segmentName(), b->segmentName());
    EXPECT_EQ(engineChoice(a.get()), engineChoice(b.get()));
    EXPECT_NE(engineChoice(a.get()), engineChoice(c.get()));
    EXPECT_NE(engineChoice(a.get()), engineChoice(nullptr));
}

TEST(SharedEngine, DuplicateSegmentNameIsRefused) {
    auto store = std::make_shared<InProcessKVStore>();
    SharedEngineOptions o;
    o.segment_name = "alice";
    ASSERT_TRUE(SharedEngine::create(store, o).ok());
    auto again = SharedEngine::create(store, o);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(again.status().message().find("'alice' is already used"), std::string::npos)
        << again.status().toString();
}

TEST(SharedEngine, CloseIsRefusedWhileLeasedAndLeaseIsRefusedAfterClose) {
    auto store = std::make_shared<InProcessKVStore>();
    auto e = makeEngine(store);
    ASSERT_TRUE(e);
    auto lease = e->lease();
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(e->leases(), 1);
    Status refused = e->close();
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("1 process group(s) still use this engine"), std::string::npos)
        << refused.toString();
    EXPECT_FALSE(e->closed());
    lease.value().reset();
    EXPECT_EQ(e->leases(), 0);
    EXPECT_TRUE(e->close().ok());
    EXPECT_TRUE(e->close().ok());  // idempotent
    auto late = e->lease();
    ASSERT_FALSE(late.ok());
    EXPECT_NE(late.status().message().find("was closed"), std::string::npos);
}

TEST(SharedEngine, LeaseKeepsTheEngineAliveAfterTheOwnerLetsGo) {
    auto store = std::make_shared<InProcessKVStore>();
    auto e = makeEngine(store);
    ASSERT_TRUE(e);
    std::shared_ptr<te::TransferEngine> engine = e->lease().value();
    std::weak_ptr<SharedEngine> weak = e;
    e.reset();
    ASSERT_FALSE(weak.expired());
    auto mem = engine->allocateSharedMemory(4096);
    ASSERT_TRUE(mem.ok()) << mem.status().toString();
    EXPECT_TRUE(engine->freeSharedMemory(mem.value()).ok());
    engine.reset();
    EXPECT_TRUE(weak.expired());
}

TEST(EngineFabricExternalEngine, GroupsShareEnginesFreeTheirMemoryAndLeaveEnginesRunning) {
    auto store = std::make_shared<InProcessKVStore>();
    std::vector<std::shared_ptr<SharedEngine>> engines{makeEngine(store), makeEngine(store)};
    ASSERT_TRUE(engines[0] && engines[1]);
    // Memory of the engine's owner, which no group may touch.
    auto own = engines[1]->engine().allocateSharedMemory(8192);
    ASSERT_TRUE(own.ok());
    const size_t before = localRegions(*engines[1]);

    {
        auto world = makeGroup(store, "g/0", engines);
        auto sub = makeGroup(store, "g/1", engines);
        ASSERT_TRUE(world[0] && world[1] && sub[0] && sub[1]);
        EXPECT_EQ(engines[0]->leases(), 2);
        EXPECT_EQ(world[0]->endpoint().rfind(engines[0]->segmentName(), 0), 0u);
        expectPutArrives(*world[0], *world[1], 1);
        expectPutArrives(*sub[0], *sub[1], 2);
        EXPECT_EQ(localRegions(*engines[1]), before + 4);  // two windows, two bounce rings
        EXPECT_FALSE(engines[1]->close().ok());
    }
    EXPECT_EQ(engines[0]->leases(), 0);
    EXPECT_EQ(localRegions(*engines[1]), before);

    // A new group on the same engines: windows may reuse freed addresses, and
    // the peer's cached descriptor must not send puts to the old mapping.
    for (int round = 0; round < 3; ++round) {
        auto again = makeGroup(store, "g/" + std::to_string(2 + round), engines);
        ASSERT_TRUE(again[0] && again[1]);
        expectPutArrives(*again[0], *again[1], static_cast<uint8_t>(3 + round));
        expectPutArrives(*again[1], *again[0], static_cast<uint8_t>(9 + round));
    }
    EXPECT_TRUE(engines[1]->engine().freeSharedMemory(own.value()).ok());
    EXPECT_TRUE(engines[0]->close().ok());
    EXPECT_TRUE(engines[1]->close().ok());
}

TEST(AgreeOnEngine, MismatchFailsOnEveryRankNamingTheChoices) {
    InProcessKVStore store;
    auto kv = std::make_shared<InProcessKVStore>();
    auto shared = makeEngine(kv);
    ASSERT_TRUE(shared);
    const std::vector<std::string> choices{engineChoice(shared.get()), engineChoice(shared.get()),
                                           engineChoice(nullptr)};
    std::vector<std::future<Status>> futures;
    for (int r = 0; r < 3; ++r) {
        futures.push_back(std::async(std::launch::async, [&store, &choices, r] {
            return agreeOnEngine(store, "grp", r, 3, choices[r], Deadline::afterMs(5000));
        }));
    }
    for (int r = 0; r < 3; ++r) {
        Status st = futures[r].get();
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "rank " << r;
        EXPECT_NE(st.message().find("the ranks disagree on the transfer engine"), std::string::npos)
            << st.toString();
        EXPECT_NE(st.message().find("rank 2 uses its own per-group engine"), std::string::npos)
            << st.toString();
    }
}

// One rank's view of a store shared by the group: `closed` stands for the
// store's host process having exited; a gated rank's reads wait for `open`;
// a watched rank says which key it last had to wait for.
struct GroupStore {
    InProcessKVStore kv;
    std::mutex mu;
    std::condition_variable cv;
    bool closed = false;
    bool gate_open = false;
    std::string awaited_by_watched;
};

class RankView final : public KVStore {
public:
    RankView(GroupStore& g, bool gated, bool watched) : g_(g), gated_(gated), watched_(watched) {}
    Status set(const std::string& key, const std::string& value) override {
        if (isClosed())
            return Unavailable("the store's host exited");
        return g_.kv.set(key, value);
    }
    Result<std::string> get(const std::string& key, Deadline deadline) override {
        if (gated_) {
            std::unique_lock<std::mutex> lock(g_.mu);
            g_.cv.wait(lock, [&] { return g_.gate_open; });
        }
        if (isClosed())
            return Unavailable("the store's host exited");
        if (watched_) {
            auto now = g_.kv.get(key, Deadline::afterMs(0));
            if (now.ok())
                return now;
            std::lock_guard<std::mutex> lock(g_.mu);
            g_.awaited_by_watched = key;
            g_.cv.notify_all();
        }
        return g_.kv.get(key, deadline);
    }
    Result<int64_t> add(const std::string& key, int64_t delta) override {
        if (isClosed())
            return Unavailable("the store's host exited");
        return g_.kv.add(key, delta);
    }
    Status remove(const std::string& key) override { return g_.kv.remove(key); }

private:
    bool isClosed() {
        std::lock_guard<std::mutex> lock(g_.mu);
        return g_.closed;
    }
    GroupStore& g_;
    bool gated_;
    bool watched_;
};

TEST(AgreeOnEngine, TheStoreHostFailsOnlyAfterEveryRankReadTheChoices) {
    // Rank 0 hosts the store (as with a TCPStore under torchrun) and exits
    // once its init failed; rank 2 published its choice but is slow to read
    // the others'. Rank 0 must not return before rank 2 has read them, or
    // rank 2 meets a dead store instead of the reason.
    GroupStore g;
    RankView views[3] = {{g, false, true}, {g, false, false}, {g, true, false}};
    const std::vector<std::string> choices{engineChoice(nullptr), engineChoice(nullptr),
                                           "shared:elsewhere/x"};
    // Rank 2's own choice is in place before anyone compares.
    ASSERT_TRUE(g.kv.set("slow/engine/2", choices[2]).ok());
    std::vector<std::future<Status>> futures;
    for (int r = 0; r < 3; ++r) {
        futures.push_back(std::async(std::launch::async, [&, r] {
            Status st = agreeOnEngine(views[r], "slow", r, 3, choices[r], Deadline::afterMs(10000));
            if (r == 0) {
                std::lock_guard<std::mutex> lock(g.mu);
                g.closed = true;  // the store's host process exits
                g.cv.notify_all();
            }
            return st;
        }));
    }
    {
        // Rank 2 reads on once rank 0 has either returned (and closed the
        // store) or is waiting on a key only rank 2 can write.
        std::unique_lock<std::mutex> lock(g.mu);
        const auto waits_on_rank_2 = [&] {
            const std::string& k = g.awaited_by_watched;
            return k.size() > 2 && k.compare(k.size() - 2, 2, "/2") == 0;
        };
        EXPECT_TRUE(g.cv.wait_for(lock, std::chrono::seconds(10), [&] {
            return g.closed || waits_on_rank_2();
        })) << "rank 0 neither returned nor waited for rank 2";
        g.gate_open = true;
        g.cv.notify_all();
    }
    for (int r = 0; r < 3; ++r) {
        Status st = futures[r].get();
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << st.toString();
        EXPECT_NE(st.message().find("the ranks disagree on the transfer engine"), std::string::npos)
            << "rank " << r << ": " << st.toString();
    }
}

TEST(AgreeOnEngine, SameChoiceAgreesAndAMissingRankTimesOut) {
    InProcessKVStore store;
    std::vector<std::future<Status>> futures;
    for (int r = 0; r < 2; ++r) {
        futures.push_back(std::async(std::launch::async, [&store, r] {
            return agreeOnEngine(store, "ok", r, 2, engineChoice(nullptr), Deadline::afterMs(5000));
        }));
    }
    for (auto& f : futures)
        EXPECT_TRUE(f.get().ok());
    Status alone =
        agreeOnEngine(store, "alone", 0, 2, engineChoice(nullptr), Deadline::afterMs(50));
    EXPECT_EQ(alone.code(), StatusCode::kTimeout) << alone.toString();
}

}  // namespace
}  // namespace mooncake::pg
