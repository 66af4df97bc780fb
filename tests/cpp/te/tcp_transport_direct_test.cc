// Drives TCP transports directly, without an engine. That lets a test lie to
// the initiator about the target's regions (to reach the target's own bounds
// checks), talk to hand-written misbehaving peers, and shorten timeouts.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/transport/tcp/frame.h"
#include "mooncake-transfer-engine/transport/tcp/tcp_transport.h"
#include "tests/cpp/te/tcp_test_util.h"

namespace mooncake::te {
namespace {

using namespace std::chrono_literals;
using test::FakeHost;
using test::fillPattern;
using test::findMismatch;
using test::Mapping;

constexpr uint64_t kMiB = 1ull << 20;

std::shared_ptr<TransferTask> makeTask(TransferOpcode op, void* local, uint64_t remote,
                                       uint64_t len, std::shared_ptr<const SegmentDesc> peer) {
    TransferRequest req{op, local, 1, remote, len};
    return std::make_shared<TransferTask>(req, std::move(peer));
}

bool waitDone(const TransferTask& task, Deadline deadline) {
    while (!task.done()) {
        if (deadline.expired())
            return false;
        std::this_thread::sleep_for(100us);
    }
    return true;
}

// An engine-less endpoint: a transport, its host and its published descriptor.
struct Endpoint {
    Endpoint(const std::string& name, const std::string& secret) : host(name, secret) {
        desc.name = name;
        transport = createTcpTransport();
    }
    ~Endpoint() { transport->shutdown(); }
    Status start() { return transport->start(&host, &desc); }

    FakeHost host;
    SegmentDesc desc;
    std::unique_ptr<Transport> transport;
};

// A hand-written peer: accepts one connection, optionally answers HELLO, and
// then swallows everything without ever replying.
class SilentPeer {
public:
    explicit SilentPeer(bool ack_hello) : ack_hello_(ack_hello) {
        fd_ = test::listenOnLoopback(&port_);
        thread_ = std::thread([this] { serve(); });
    }
    ~SilentPeer() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    SegmentDesc desc() const {
        SegmentDesc d;
        d.name = "silent";
        d.tcp_host = "127.0.0.1";
        d.tcp_port = port_;
        d.regions.push_back({1 << 20, 1 << 30, "cpu", true, "", "", ""});
        return d;
    }

private:
    bool readable(int fd) {
        pollfd p{fd, POLLIN, 0};
        while (!stop_) {
            if (::poll(&p, 1, 20) > 0)
                return true;
        }
        return false;
    }
    void serve() {
        if (!readable(fd_))
            return;
        int c = ::accept(fd_, nullptr, nullptr);
        std::string in;
        char buf[65536];
        bool acked = false;
        while (readable(c)) {
            ssize_t n = ::recv(c, buf, sizeof(buf), 0);
            if (n <= 0)
                break;
            in.append(buf, static_cast<size_t>(n));
            if (ack_hello_ && !acked && in.size() >= tcp::kFrameHeaderSize) {
                auto h =
                    tcp::parseFrameHeader(reinterpret_cast<const uint8_t*>(in.data()), in.size());
                if (h.ok() && in.size() >= tcp::kFrameHeaderSize + h->payload_len) {
                    tcp::FrameHeader ack;
                    ack.type = tcp::FrameType::kHelloAck;
                    std::string frame = tcp::encodeFrame(ack, "silent");
                    (void)!::send(c, frame.data(), frame.size(), MSG_NOSIGNAL);
                    acked = true;
                }
            }
            if (in.size() > (1 << 20))
                in.clear();  // only the HELLO matters
        }
        ::close(c);
    }

    bool ack_hello_;
    int fd_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

// The target rejects what the initiator was (falsely) told is registered, and
// the same connection keeps serving the good requests pipelined behind.
TEST(TcpTransportDirectTest, TargetBoundsChecksEveryRequestAndStaysUsable) {
    Mapping remote(8 * kMiB, false), local(8 * kMiB, false);
    ASSERT_TRUE(remote.ok() && local.ok());
    Endpoint target("target", "s"), initiator("initiator", "s");
    // Only [1 MiB, 5 MiB) of the target mapping is really registered.
    ASSERT_TRUE(target.host.memory().add({remote.addr() + kMiB, 4 * kMiB, "cpu", true}).ok());
    ASSERT_TRUE(target.start().ok());
    ASSERT_TRUE(initiator.start().ok());
    auto lie = std::make_shared<SegmentDesc>(target.desc);
    lie->regions.push_back({remote.addr(), remote.size(), "cpu", true, "", "", ""});
    std::memset(remote.data(), 0xEE, remote.size());
    std::memset(local.bytes() + 4 * kMiB, 0x11, 4 * kMiB);
    fillPattern(local.bytes(), 4 * kMiB, 77);

    std::vector<std::shared_ptr<TransferTask>> bad = {
        // Entirely outside the registration.
        makeTask(TransferOpcode::kWrite, local.data(), remote.addr(), 4096, lie),
        // Starts inside, ends outside, spans several slices: nothing may land.
        makeTask(TransferOpcode::kWrite, local.data(), remote.addr() + 2 * kMiB, 3 * kMiB + 512,
                 lie),
        makeTask(TransferOpcode::kRead, local.bytes() + 4 * kMiB, remote.addr() + 4 * kMiB,
                 2 * kMiB, lie),
    };
    std::vector<std::shared_ptr<TransferTask>> good = {
        makeTask(TransferOpcode::kWrite, local.bytes() + 1, remote.addr() + kMiB + 3, 3 * kMiB + 5,
                 lie),
        // Pipelined right behind the write: must see its data.
        makeTask(TransferOpcode::kRead, local.bytes() + 4 * kMiB + 7, remote.addr() + kMiB + 3,
                 3 * kMiB + 5, lie),
    };
    for (auto& t : bad)
        initiator.transport->submit(t);
    for (auto& t : good)
        initiator.transport->submit(t);
    for (auto& t : bad) {
        ASSERT_TRUE(waitDone(*t, Deadline::afterMs(10000)));
        EXPECT_EQ(t->status().state, TransferState::kFailed);
        EXPECT_EQ(t->status().error.code(), StatusCode::kOutOfRange)
            << t->status().error.toString();
    }
    for (auto& t : good) {
        ASSERT_TRUE(waitDone(*t, Deadline::afterMs(10000)));
        EXPECT_EQ(t->status().state, TransferState::kCompleted) << t->status().error.toString();
    }
    // Untouched: everything but the good write's range.
    const uint8_t* r = remote.bytes();
    for (uint64_t i = 0; i < kMiB + 3; ++i)
        ASSERT_EQ(r[i], 0xEE) << i;
    for (uint64_t i = 4 * kMiB + 8; i < remote.size(); ++i)
        ASSERT_EQ(r[i], 0xEE) << i;
    // The good write and the read behind it, byte for byte.
    std::vector<uint8_t> expect(local.bytes() + 1, local.bytes() + 1 + 3 * kMiB + 5);
    EXPECT_EQ(std::memcmp(r + kMiB + 3, expect.data(), expect.size()), 0);
    EXPECT_EQ(std::memcmp(local.bytes() + 4 * kMiB + 7, expect.data(), expect.size()), 0);
    EXPECT_EQ(local.bytes()[4 * kMiB + 6], 0x11);  // the failed READ landed nothing
}

// READ data leaves the target's memory only as it is sent; a WRITE queued
// behind the READ must still not change what the READ returns.
TEST(TcpTransportDirectTest, WriteBehindReadDoesNotOvertakeIt) {
    const uint64_t len = 24 * kMiB;
    Mapping remote(len, false), local(2 * len, false);
    ASSERT_TRUE(remote.ok() && local.ok());
    Endpoint target("target", "s"), initiator("initiator", "s");
    ASSERT_TRUE(target.host.memory().add({remote.addr(), len, "cpu", true}).ok());
    ASSERT_TRUE(target.start().ok());
    ASSERT_TRUE(initiator.start().ok());
    auto peer = std::make_shared<SegmentDesc>(target.desc);
    peer->regions.push_back({remote.addr(), len, "cpu", true, "", "", ""});
    fillPattern(remote.bytes(), len, 1);
    fillPattern(local.bytes() + len, len, 2);
    auto rd = makeTask(TransferOpcode::kRead, local.data(), remote.addr(), len, peer);
    auto wr = makeTask(TransferOpcode::kWrite, local.bytes() + len, remote.addr(), len, peer);
    initiator.transport->submit(rd);
    initiator.transport->submit(wr);
    ASSERT_TRUE(waitDone(*rd, Deadline::afterMs(20000)));
    ASSERT_TRUE(waitDone(*wr, Deadline::afterMs(20000)));
    ASSERT_EQ(rd->status().state, TransferState::kCompleted) << rd->status().error.toString();
    ASSERT_EQ(wr->status().state, TransferState::kCompleted) << wr->status().error.toString();
    EXPECT_EQ(findMismatch(local.bytes(), len, 1), -1);
    EXPECT_EQ(findMismatch(remote.bytes(), len, 2), -1);
}

TEST(TcpTransportDirectTest, ShutdownAbortsPendingAndIsIdempotent) {
    SilentPeer peer(/*ack_hello=*/true);
    Endpoint initiator("initiator", "s");
    ASSERT_TRUE(initiator.start().ok());
    std::vector<uint8_t> buf(64 * 1024, 7);
    auto desc = std::make_shared<SegmentDesc>(peer.desc());
    auto w = makeTask(TransferOpcode::kWrite, buf.data(), 1 << 20, buf.size(), desc);
    auto r = makeTask(TransferOpcode::kRead, buf.data(), 1 << 20, 4096, desc);
    initiator.transport->submit(w);
    initiator.transport->submit(r);
    EXPECT_FALSE(w->done());
    initiator.transport->shutdown();
    initiator.transport->shutdown();
    for (auto* t : {w.get(), r.get()}) {
        ASSERT_TRUE(t->done());
        EXPECT_EQ(t->status().error.code(), StatusCode::kAborted) << t->status().error.toString();
    }
    auto late = makeTask(TransferOpcode::kWrite, buf.data(), 1 << 20, 16, desc);
    initiator.transport->submit(late);
    ASSERT_TRUE(late->done());
    EXPECT_EQ(late->status().error.code(), StatusCode::kAborted);
    EXPECT_EQ(initiator.transport->probe(*desc, Deadline::afterMs(1000)).code(),
              StatusCode::kAborted);
}

// Runs in a re-executed child (death-test style) so that the timeout knobs,
// read once per process, can be shortened. Returns the exit code.
int timeoutScenario() {
    ::setenv("MC_TCP_REQUEST_TIMEOUT_MS", "300", 1);
    ::setenv("MC_TCP_CONNECT_TIMEOUT_MS", "300", 1);
    int failures = 0;
    auto check = [&](bool ok, const std::string& what) {
        if (!ok) {
            std::fprintf(stderr, "FAILED: %s\n", what.c_str());
            ++failures;
        }
    };
    Endpoint initiator("initiator", "s");
    check(initiator.start().ok(), "start");
    std::vector<uint8_t> buf(64 * 1024, 0x22);
    {
        // Connected and admitted, but requests are never answered.
        SilentPeer peer(/*ack_hello=*/true);
        auto desc = std::make_shared<SegmentDesc>(peer.desc());
        auto t0 = std::chrono::steady_clock::now();
        auto w = makeTask(TransferOpcode::kWrite, buf.data(), 1 << 20, buf.size(), desc);
        auto r = makeTask(TransferOpcode::kRead, buf.data(), 1 << 20, 4096, desc);
        initiator.transport->submit(w);
        initiator.transport->submit(r);
        check(waitDone(*w, Deadline::afterMs(5000)) && waitDone(*r, Deadline::afterMs(5000)),
              "requests finish");
        auto took = std::chrono::steady_clock::now() - t0;
        check(took >= 300ms && took < 3s, "requests fail after the request timeout");
        check(w->status().error.code() == StatusCode::kTimeout, w->status().error.toString());
        check(r->status().error.code() == StatusCode::kTimeout, r->status().error.toString());
        check(buf[0] == 0x22, "timed-out READ left the buffer alone");
    }
    {
        // Accepts the socket but never answers HELLO.
        SilentPeer peer(/*ack_hello=*/false);
        auto desc = std::make_shared<SegmentDesc>(peer.desc());
        auto w = makeTask(TransferOpcode::kWrite, buf.data(), 1 << 20, 16, desc);
        initiator.transport->submit(w);
        check(waitDone(*w, Deadline::afterMs(5000)), "handshake timeout fires");
        check(w->status().error.code() == StatusCode::kTimeout, w->status().error.toString());
        Status probe = initiator.transport->probe(*desc, Deadline::afterMs(200));
        check(probe.code() == StatusCode::kTimeout, "probe: " + probe.toString());
    }
    return failures == 0 ? 0 : 1;
}

TEST(TcpTransportDeathTest, OverdueRequestsAndHandshakesTimeOut) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(_exit(timeoutScenario()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace mooncake::te
