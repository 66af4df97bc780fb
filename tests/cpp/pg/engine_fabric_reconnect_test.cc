// EngineFabric::connectPeer while another thread puts: the elastic backend
// reconnects a slot (a replacement, a reserved slot filled) on its worker
// while the P2P progress thread writes to every peer. Each put must go whole
// to either the previous or the new connection, and puts to other peers must
// be untouched. Three fabrics share this process; rank 0's slot 1 is pointed
// alternately at rank 1's and rank 2's window.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRanks = 3;
constexpr size_t kWindow = 1 << 16;

Deadline kPutDeadline() {
    return Deadline::afterMs(10000);
}
constexpr int kSlots = 16;               // records per area, reused round-robin
constexpr size_t kRecord = 64;           // 7 body words + a flag word
constexpr uint64_t kAreaToSlot1 = 0;     // rank 0's puts to "rank 1"
constexpr uint64_t kAreaToRank2 = 8192;  // rank 0's puts to rank 2
constexpr int kReconnects = 300;

struct Record {
    std::array<uint64_t, 7> body;
    uint64_t flag;
};
static_assert(sizeof(Record) == kRecord);

Record readRecord(const uint8_t* window, uint64_t area, int slot) {
    Record r;
    std::memcpy(&r, window + area + static_cast<uint64_t>(slot) * kRecord, sizeof(r));
    return r;
}

bool bodyWhole(const Record& r) {
    for (uint64_t w : r.body) {
        if (w != r.body[0])
            return false;
    }
    return true;
}

std::vector<std::shared_ptr<EngineFabric>> makeGroup(std::shared_ptr<KVStore> store) {
    std::vector<std::shared_ptr<EngineFabric>> fabrics(kRanks);
    std::vector<std::string> errors(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
        threads.emplace_back([&, r] {
            EngineFabricOptions o;
            o.rank = r;
            o.size = kRanks;
            o.window_bytes = kWindow;
            o.group_key = "reconnect";
            o.bootstrap_timeout_ms = 20000;
            auto made = EngineFabric::create(store, o);
            if (made.ok())
                fabrics[r] = made.value();
            else
                errors[r] = made.status().toString();
        });
    }
    for (auto& t : threads)
        t.join();
    for (int r = 0; r < kRanks; ++r)
        EXPECT_TRUE(fabrics[r]) << "rank " << r << ": " << errors[r];
    return fabrics;
}

// The segments device windows are mapped through: each connected peer's,
// following a reconnect to another process.
TEST(EngineFabricReconnect, PeerSegmentsFollowTheConnections) {
    auto store = std::make_shared<InProcessKVStore>();
    auto f = makeGroup(store);
    for (const auto& fabric : f)
        ASSERT_TRUE(fabric);
    const std::string ep1 = f[1]->endpoint();
    const std::string ep2 = f[2]->endpoint();
    const std::string seg1 = ep1.substr(0, ep1.find('#'));
    const std::string seg2 = ep2.substr(0, ep2.find('#'));
    ASSERT_FALSE(seg1.empty());
    ASSERT_NE(seg1, seg2);
    EXPECT_EQ(EngineFabric::segmentOf(ep1), seg1);
    EXPECT_EQ(f[0]->peerSegments(kRanks), (std::vector<std::string>{"", seg1, seg2}));
    ASSERT_TRUE(f[0]->connectPeer(1, ep2, Deadline::after(std::chrono::seconds(10))).ok());
    EXPECT_EQ(f[0]->peerSegments(kRanks), (std::vector<std::string>{"", seg2, seg2}));
}

TEST(EngineFabricReconnect, ConnectPeerWhilePutsRun) {
    auto store = std::make_shared<InProcessKVStore>();
    auto f = makeGroup(store);
    for (const auto& fabric : f)
        ASSERT_TRUE(fabric);
    const std::string ep1 = f[1]->endpoint();
    const std::string ep2 = f[2]->endpoint();
    uint8_t* const w1 = f[1]->localWindow();
    uint8_t* const w2 = f[2]->localWindow();
    // Rank 0's own mappings of those windows (other addresses, same memory).
    uint8_t* const mapped1 = f[0]->peerWindow(1);
    uint8_t* const mapped2 = f[0]->peerWindow(2);
    ASSERT_NE(mapped1, nullptr);
    ASSERT_NE(mapped2, nullptr);

    std::atomic<bool> stop{false};
    std::atomic<uint64_t> puts{0};
    std::string writer_error;  // read only after the join
    std::atomic<bool> writer_failed{false};
    std::thread writer([&] {
        EngineFabric& fab = *f[0];
        for (uint64_t i = 1; !stop.load(std::memory_order_relaxed); ++i) {
            const uint64_t at = static_cast<uint64_t>(i % kSlots) * kRecord;
            Record rec;
            rec.body.fill(i);
            for (auto [peer, area] : {std::pair{1, kAreaToSlot1}, std::pair{2, kAreaToRank2}}) {
                Status st = fab.put(peer, area + at, &rec, offsetof(Record, flag), kPutDeadline());
                if (st.ok())
                    st = fab.putFlag(peer, area + at + offsetof(Record, flag), i, kPutDeadline());
                if (!st.ok()) {
                    writer_error = "put " + std::to_string(i) + " to rank " + std::to_string(peer) +
                                   ": " + st.toString();
                    writer_failed.store(true);
                    return;
                }
            }
            uint8_t* seen = fab.peerWindow(1);
            if (seen != mapped1 && seen != mapped2) {
                writer_error = "peerWindow(1) is neither rank 1's nor rank 2's window";
                writer_failed.store(true);
                return;
            }
            puts.store(i, std::memory_order_release);
        }
    });

    int reconnects = 0;
    for (; reconnects < kReconnects && !writer_failed.load(); ++reconnects) {
        const std::string& ep = reconnects % 2 == 0 ? ep2 : ep1;
        Status st = f[0]->connectPeer(1, ep, Deadline::after(std::chrono::seconds(10)));
        if (!st.ok()) {
            ADD_FAILURE() << "reconnect " << reconnects << ": " << st.toString();
            break;
        }
        EXPECT_EQ(f[0]->peerEndpoint(1), ep);
        // Each connection takes puts before the next reconnect. (No ASSERT in
        // this loop: returning would leave the writer thread running.)
        const uint64_t before = puts.load(std::memory_order_acquire);
        const auto until = Clock::now() + std::chrono::seconds(10);
        while (puts.load(std::memory_order_acquire) < before + 2 && !writer_failed.load() &&
               Clock::now() < until) {
            std::this_thread::yield();
        }
        if (writer_failed.load())
            break;
        if (puts.load() < before + 2) {
            ADD_FAILURE() << "the writer stalled after reconnect " << reconnects;
            break;
        }
    }
    stop.store(true);
    writer.join();
    ASSERT_TRUE(writer_error.empty()) << writer_error;
    EXPECT_EQ(reconnects, kReconnects);
    const uint64_t last = puts.load();

    // Rank 2's own area: only rank 0's puts to rank 2 land there, each body
    // then its flag, so every record is whole and holds the last value
    // written to its slot.
    for (int s = 0; s < kSlots; ++s) {
        uint64_t want = last - (last + kSlots - s) % kSlots;
        Record r = readRecord(w2, kAreaToRank2, s);
        EXPECT_TRUE(bodyWhole(r)) << "slot " << s;
        EXPECT_EQ(r.body[0], want) << "slot " << s;
        EXPECT_EQ(r.flag, want) << "slot " << s;
    }
    // The slot-1 area of both windows: a put went whole to one connection.
    for (uint8_t* w : {w1, w2}) {
        for (int s = 0; s < kSlots; ++s) {
            Record r = readRecord(w, kAreaToSlot1, s);
            EXPECT_TRUE(bodyWhole(r)) << "slot " << s << " of " << (w == w1 ? "rank 1" : "rank 2");
        }
    }
    // The last reconnect pointed slot 1 back at rank 1.
    Record rec;
    rec.body.fill(~uint64_t{0});
    ASSERT_TRUE(f[0]->put(1, kAreaToSlot1, &rec, offsetof(Record, flag), kPutDeadline()).ok());
    EXPECT_EQ(readRecord(w1, kAreaToSlot1, 0).body[6], ~uint64_t{0});
}

}  // namespace
}  // namespace mooncake::pg
