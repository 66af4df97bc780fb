// EngineFabric over tcp with a stalled peer: rank 2 is a hand-written
// endpoint that accepts the connection and reads every byte but never
// completes a write, so rank 0's staging space for it fills and stays full.
// A put that then has to wait ends at its own deadline, and it waits without
// holding up puts to the healthy rank 1.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-transfer-engine/engine/segment.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/tcp/frame.h"
#include "tests/cpp/te/tcp_test_util.h"

namespace mooncake::pg {
namespace {

constexpr int kRanks = 3;
constexpr size_t kWindow = 1 << 20;
// Each peer's outbox is 256 KiB: puts go out in pieces of at most 128 KiB.
constexpr size_t kOutbox = 256 << 10;
constexpr size_t kPiece = kOutbox / 2;
constexpr uint64_t kStalledWindowAddr = 1ull << 28;
const char* const kStalledName = "stall/rank2";

// Answers HELLO on every connection, then reads and counts every byte and
// never replies: writes to it stay pending.
class StalledPeer {
public:
    StalledPeer() {
        fd_ = te::test::listenOnLoopback(&port_);
        thread_ = std::thread([this] { serve(); });
    }
    ~StalledPeer() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    uint16_t port() const { return port_; }
    // Bytes received after the HELLOs.
    uint64_t received() const { return received_.load(); }
    // Closes every connection: the initiators fail what is pending on them.
    void disconnect() {
        stop_ = true;
        thread_.join();
        thread_ = std::thread([] {});
    }

private:
    struct Conn {
        int fd;
        std::string in;
        bool hello_done = false;
    };
    void serve() {
        std::vector<Conn> conns;
        while (!stop_) {
            std::vector<pollfd> fds{{fd_, POLLIN, 0}};
            for (auto& c : conns)
                fds.push_back({c.fd, POLLIN, 0});
            if (::poll(fds.data(), fds.size(), 20) <= 0)
                continue;
            if (fds[0].revents & POLLIN) {
                int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
                if (c >= 0)
                    conns.push_back({c, {}, false});
            }
            for (size_t i = 1; i < fds.size(); ++i) {
                if (fds[i].revents == 0)
                    continue;
                Conn& c = conns[i - 1];
                char buf[65536];
                ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
                if (n <= 0)
                    continue;
                if (c.hello_done) {
                    received_ += static_cast<uint64_t>(n);
                    continue;
                }
                c.in.append(buf, static_cast<size_t>(n));
                auto h = te::tcp::parseFrameHeader(reinterpret_cast<const uint8_t*>(c.in.data()),
                                                   c.in.size());
                if (!h.ok() || c.in.size() < te::tcp::kFrameHeaderSize + h->payload_len)
                    continue;
                received_ += c.in.size() - te::tcp::kFrameHeaderSize - h->payload_len;
                c.hello_done = true;
                te::tcp::FrameHeader ack;
                ack.type = te::tcp::FrameType::kHelloAck;
                std::string frame = te::tcp::encodeFrame(ack, kStalledName);
                (void)!::send(c.fd, frame.data(), frame.size(), MSG_NOSIGNAL);
            }
        }
        for (auto& c : conns)
            ::close(c.fd);
    }

    int fd_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> received_{0};
    std::thread thread_;
};

struct StallGroup {
    explicit StallGroup(StalledPeer* peer) : stalled(peer) {}
    // Disconnecting fails the writes pending at rank 2, so the fabrics'
    // teardown drains at once, also when an assertion ended the test early.
    ~StallGroup() {
        stalled->disconnect();
        fabrics.clear();
    }
    StalledPeer* stalled;
    std::vector<std::shared_ptr<te::TransferEngine>> engines;
    std::vector<std::shared_ptr<EngineFabric>> fabrics;  // ranks 0 and 1
};

// Ranks 0 and 1 are real fabrics over tcp; rank 2 is `stalled`.
void makeGroup(const std::shared_ptr<KVStore>& store, StalledPeer& stalled, StallGroup& g) {
    te::SegmentDesc desc;
    desc.name = kStalledName;
    desc.host_id = "another-host";
    desc.tcp_host = "127.0.0.1";
    desc.tcp_port = stalled.port();
    desc.regions.push_back({kStalledWindowAddr, kWindow, "cpu", true, "", "", ""});
    EXPECT_TRUE(store->set("stall/te/segment/" + std::string(kStalledName), desc.serialize()).ok());
    EXPECT_TRUE(store
                    ->set("stall/rank/2",
                          std::string(kStalledName) + "#" + std::to_string(kStalledWindowAddr))
                    .ok());
    std::vector<std::future<Result<std::shared_ptr<EngineFabric>>>> futures;
    for (int r = 0; r < 2; ++r) {
        te::EngineOptions eo;
        eo.store = store;
        eo.segment_name = "stall/rank" + std::to_string(r);
        eo.secret = "stall-test";
        eo.key_prefix = "stall/te";
        eo.force_tcp = true;
        auto engine = std::make_shared<te::TransferEngine>(eo);
        Status st = engine->init("127.0.0.1", {});
        EXPECT_TRUE(st.ok()) << st.toString();
        g.engines.push_back(engine);
        EngineFabricOptions o;
        o.rank = r;
        o.size = kRanks;
        o.window_bytes = kWindow;
        o.group_key = "stall";
        // Long, so that only a put's own deadline can end its wait early.
        o.bootstrap_timeout_ms = 120000;
        o.bounce_bytes = kRanks * kOutbox;
        o.engine = engine;
        futures.push_back(
            std::async(std::launch::async, [store, o] { return EngineFabric::create(store, o); }));
    }
    for (auto& f : futures) {
        auto made = f.get();
        EXPECT_TRUE(made.ok()) << made.status().toString();
        g.fabrics.push_back(made.ok() ? made.value() : nullptr);
    }
}

// Waits for `value` in the 8-byte flag at `offset` of `window`.
bool awaitFlag(const uint8_t* window, uint64_t offset, uint64_t value, Deadline deadline) {
    while (__atomic_load_n(reinterpret_cast<const uint64_t*>(window + offset), __ATOMIC_ACQUIRE) !=
           value) {
        if (deadline.expired())
            return false;
        std::this_thread::yield();
    }
    return true;
}

TEST(EngineFabricStall, APutThatMustWaitForAStalledPeerEndsAtItsDeadline) {
    auto store = std::make_shared<InProcessKVStore>();
    StalledPeer stalled;
    StallGroup g(&stalled);
    makeGroup(store, stalled, g);
    ASSERT_TRUE(g.fabrics[0] && g.fabrics[1]);
    EngineFabric& f0 = *g.fabrics[0];
    ASSERT_EQ(f0.peerWindow(2), nullptr);
    std::vector<uint8_t> data(kPiece, 0x5a);

    // Two pieces fill rank 2's outbox; their writes never complete.
    const Deadline generous = Deadline::afterMs(30000);
    ASSERT_TRUE(f0.put(2, 0, data.data(), kPiece, generous).ok());
    ASSERT_TRUE(f0.put(2, kPiece, data.data(), kPiece, generous).ok());

    Status st = f0.put(2, 0, data.data(), kPiece, Deadline::afterMs(200));
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_NE(st.toString().find("rank 2"), std::string::npos) << st.toString();
    st = f0.putFlag(2, 64, 1, Deadline::afterMs(200));
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_FALSE(f0.peerFailed(2)) << "a put that timed out is no evidence of death";

    // Rank 1 is unaffected.
    ASSERT_TRUE(f0.put(1, 0, data.data(), 4096, generous).ok());
    ASSERT_TRUE(f0.putFlag(1, 8192, 11, generous).ok());
    EXPECT_TRUE(awaitFlag(g.fabrics[1]->localWindow(), 8192, 11, generous));
    EXPECT_EQ(std::memcmp(g.fabrics[1]->localWindow(), data.data(), 4096), 0);
}

TEST(EngineFabricStall, APutWaitingOnAStalledPeerDoesNotHoldUpPutsToOthers) {
    auto store = std::make_shared<InProcessKVStore>();
    StalledPeer stalled;
    StallGroup g(&stalled);
    makeGroup(store, stalled, g);
    ASSERT_TRUE(g.fabrics[0] && g.fabrics[1]);
    EngineFabric& f0 = *g.fabrics[0];
    std::vector<uint8_t> data(2 * kPiece, 0x3c);
    ASSERT_TRUE(f0.put(2, 0, data.data(), kPiece, Deadline::afterMs(30000)).ok());
    const uint64_t before = stalled.received();

    // Two pieces: the first fills the outbox, the second waits for space
    // that never frees. Once the first is on the wire, this put is inside
    // that wait (or about to enter it).
    auto waiting = std::async(std::launch::async, [&] {
        return f0.put(2, kPiece, data.data(), 2 * kPiece, Deadline::afterMs(5000));
    });
    const Deadline seen = Deadline::afterMs(30000);
    while (stalled.received() < before + kPiece) {
        ASSERT_FALSE(seen.expired()) << "the first piece never reached rank 2";
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }

    auto other = std::async(std::launch::async, [&] {
        std::vector<uint8_t> mine(4096, 0x77);
        Status st = f0.put(1, 0, mine.data(), mine.size(), Deadline::afterMs(30000));
        if (st.ok())
            st = f0.putFlag(1, 8192, 21, Deadline::afterMs(30000));
        return st;
    });
    // A hang detector, not a measurement: the put to rank 1 needs no wait.
    ASSERT_EQ(other.wait_for(std::chrono::seconds(4)), std::future_status::ready)
        << "a put to the healthy rank 1 waited for the put to the stalled rank 2";
    Status st = other.get();
    EXPECT_TRUE(st.ok()) << st.toString();
    EXPECT_TRUE(awaitFlag(g.fabrics[1]->localWindow(), 8192, 21, Deadline::afterMs(30000)));
    EXPECT_EQ(g.fabrics[1]->localWindow()[4095], 0x77);

    st = waiting.get();
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
}

}  // namespace
}  // namespace mooncake::pg
