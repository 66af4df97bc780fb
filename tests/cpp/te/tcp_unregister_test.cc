// Unregistering memory while a peer's WRITE is landing in it over tcp. The
// target copies a WRITE's payload into the region through a raw pointer as it
// arrives; the region's owner frees the memory once unregister returns, so no
// byte may land after that. A hand-written peer sends half a WRITE and stops,
// which pins the moment deterministically.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/engine/memory_registry.h"
#include "mooncake-transfer-engine/engine/segment.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/tcp/frame.h"
#include "tests/cpp/te/tcp_test_util.h"

namespace mooncake::te {
namespace {

using namespace std::chrono_literals;
using test::fillPattern;
using test::findMismatch;
using test::Mapping;
using test::TempDir;

// A blocking loopback client that speaks the frame protocol by hand.
class RawPeer {
public:
    explicit RawPeer(uint16_t port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(port);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    }
    ~RawPeer() { ::close(fd_); }
    bool connected() const { return connected_; }

    bool send(const void* data, size_t len) {
        const auto* p = static_cast<const uint8_t*>(data);
        while (len > 0) {
            ssize_t n = ::send(fd_, p, len, MSG_NOSIGNAL);
            if (n <= 0)
                return false;
            p += n;
            len -= static_cast<size_t>(n);
        }
        return true;
    }
    bool send(const std::string& bytes) { return send(bytes.data(), bytes.size()); }

    // The next whole frame, or an error at the deadline or on a closed socket.
    Result<tcp::FrameHeader> readFrame(Deadline deadline, std::string* payload) {
        while (true) {
            if (in_.size() >= tcp::kFrameHeaderSize) {
                auto h =
                    tcp::parseFrameHeader(reinterpret_cast<const uint8_t*>(in_.data()), in_.size());
                if (!h.ok())
                    return h.status();
                const size_t total = tcp::kFrameHeaderSize + h->payload_len;
                if (in_.size() >= total) {
                    *payload = in_.substr(tcp::kFrameHeaderSize, h->payload_len);
                    in_.erase(0, total);
                    return h;
                }
            }
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, deadline.remainingMsForPoll()) <= 0)
                return Timeout("no frame from the target before the deadline");
            char buf[4096];
            ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
            if (n <= 0)
                return PeerFailure("the target closed the connection");
            in_.append(buf, static_cast<size_t>(n));
        }
    }

private:
    int fd_ = -1;
    bool connected_ = false;
    std::string in_;
};

// Polls memory another thread writes until it holds `expect`.
bool waitBytes(const uint8_t* p, const uint8_t* expect, size_t n, Deadline deadline) {
    while (std::memcmp(p, expect, n) != 0) {
        if (deadline.expired())
            return false;
        std::this_thread::sleep_for(100us);
    }
    return true;
}

TEST(TcpUnregisterTest, WriteLandingDuringUnregisterIsFailedAndNothingLandsAfter) {
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    EngineOptions opts;
    opts.store = store;
    opts.segment_name = "target";
    opts.secret = "s3cret";
    opts.force_tcp = true;
    TransferEngine engine(opts);
    ASSERT_TRUE(engine.init("127.0.0.1", {}).ok());
    Mapping region(1 << 20, false);
    ASSERT_TRUE(region.ok());
    ASSERT_TRUE(engine.registerLocalMemory(region.data(), region.size()).ok());
    auto published = store->get(opts.key_prefix + "/segment/target", Deadline::afterMs(10000));
    ASSERT_TRUE(published.ok()) << published.status().toString();
    auto desc = SegmentDesc::parse(*published);
    ASSERT_TRUE(desc.ok()) << desc.status().toString();

    RawPeer peer(desc->tcp_port);
    ASSERT_TRUE(peer.connected());
    tcp::FrameHeader hello;
    hello.type = tcp::FrameType::kHello;
    ASSERT_TRUE(peer.send(tcp::encodeFrame(hello, tcp::encodeHello({opts.secret, "raw"}))));
    std::string body;
    auto ack = peer.readFrame(Deadline::afterMs(10000), &body);
    ASSERT_TRUE(ack.ok()) << ack.status().toString();
    ASSERT_EQ(ack->type, tcp::FrameType::kHelloAck);

    // One WRITE frame of 256 KiB of which only the first half is sent: the
    // target has checked the range and is copying into the region.
    constexpr size_t kLen = 256 << 10;
    constexpr size_t kHalf = kLen / 2;
    std::string payload(kLen, '\0');
    fillPattern(reinterpret_cast<uint8_t*>(payload.data()), kLen, 41);
    tcp::FrameHeader write;
    write.type = tcp::FrameType::kWrite;
    write.request_id = 1;
    write.remote_addr = region.addr();
    write.length = kLen;
    write.payload_len = kLen;
    write.payload_crc = crc32c(0, payload.data(), kLen);
    uint8_t hdr[tcp::kFrameHeaderSize];
    tcp::encodeFrameHeader(write, hdr);
    ASSERT_TRUE(peer.send(hdr, sizeof(hdr)));
    ASSERT_TRUE(peer.send(payload.data(), kHalf));
    ASSERT_TRUE(waitBytes(region.bytes(), reinterpret_cast<const uint8_t*>(payload.data()), kHalf,
                          Deadline::afterMs(10000)));

    // The caller may free the memory as soon as this returns.
    Status st = engine.unregisterLocalMemory(region.data(), Deadline::afterMs(10000));
    ASSERT_TRUE(st.ok()) << st.toString();

    // The rest of the payload, then a PING: its PONG proves the target has
    // processed every byte sent before it.
    ASSERT_TRUE(peer.send(payload.data() + kHalf, kLen - kHalf));
    tcp::FrameHeader ping;
    ping.type = tcp::FrameType::kPing;
    ping.request_id = 2;
    ASSERT_TRUE(peer.send(tcp::encodeFrame(ping, "")));
    bool completed = false;
    StatusCode write_code = StatusCode::kOk;
    std::string write_message;
    while (true) {
        auto f = peer.readFrame(Deadline::afterMs(10000), &body);
        ASSERT_TRUE(f.ok()) << f.status().toString();
        if (f->type == tcp::FrameType::kCompletion && f->request_id == 1) {
            completed = true;
            write_code = f->status;
            write_message = body;
        }
        if (f->type == tcp::FrameType::kPong)
            break;
    }
    ASSERT_TRUE(completed) << "the WRITE got no completion";
    EXPECT_EQ(write_code, StatusCode::kAborted) << write_message;
    EXPECT_NE(write_message.find("unregistered"), std::string::npos) << write_message;
    // Not a byte of the second half reached the unregistered region.
    for (size_t i = kHalf; i < kLen; ++i)
        ASSERT_EQ(region.bytes()[i], 0) << "byte " << i << " landed after unregister returned";

    // A new WRITE into the old range is refused and lands nothing.
    write.request_id = 3;
    write.length = write.payload_len = 64;
    write.payload_crc = crc32c(0, payload.data(), 64);
    ASSERT_TRUE(peer.send(tcp::encodeFrame(write, std::string_view(payload.data(), 64))));
    auto refused = peer.readFrame(Deadline::afterMs(10000), &body);
    ASSERT_TRUE(refused.ok()) << refused.status().toString();
    EXPECT_EQ(refused->request_id, 3u);
    EXPECT_EQ(refused->status, StatusCode::kOutOfRange) << body;
}

// The registry side alone: a use taken before removal holds the region, and
// removal gives up at its deadline leaving the region registered but refused.
TEST(MemoryRegistryTest, RemovalWaitsForUsesAndKeepsTheRegionAtTheDeadline) {
    MemoryRegistry reg;
    ASSERT_TRUE(reg.add({4096, 8192, "cpu", true}).ok());
    auto use = reg.beginRemoteUse(4096 + 100, 200);
    ASSERT_TRUE(use.ok());
    EXPECT_EQ(reg.remoteUses(4096), 1u);

    ASSERT_TRUE(reg.beginRemove(4096).ok());
    // Refused from now on, and hidden from lookups.
    EXPECT_EQ(reg.beginRemoteUse(4096, 8).status().code(), StatusCode::kOutOfRange);
    EXPECT_FALSE(reg.find(4096, 8).has_value());
    Status late = reg.finishRemove(4096, Deadline::afterMs(20));
    EXPECT_EQ(late.code(), StatusCode::kTimeout) << late.toString();
    EXPECT_NE(late.toString().find("1 remote write(s)"), std::string::npos) << late.toString();
    // Still registered: its memory cannot be registered again yet.
    EXPECT_FALSE(reg.add({4096, 16, "cpu", true}).ok());

    use->release();
    EXPECT_EQ(reg.remoteUses(4096), 0u);
    ASSERT_TRUE(reg.finishRemove(4096, Deadline::afterMs(10000)).ok());
    EXPECT_TRUE(reg.add({4096, 16, "cpu", true}).ok());
}

}  // namespace
}  // namespace mooncake::te
