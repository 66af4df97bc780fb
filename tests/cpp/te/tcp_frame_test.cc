// Wire-format checks of the TCP transport: round trips and rejection of
// malformed headers and payloads.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/transport/tcp/frame.h"

namespace mooncake::te::tcp {
namespace {

const uint8_t* bytes(const std::string& s) {
    return reinterpret_cast<const uint8_t*>(s.data());
}

FrameHeader writeHeader() {
    FrameHeader h;
    h.type = FrameType::kWrite;
    h.request_id = 42;
    h.remote_addr = 0x7f0000001000;
    h.length = 3 << 20;
    return h;
}

// Header bytes for `h` as given, without encodeFrame()'s payload fixups.
std::string rawHeader(const FrameHeader& h) {
    std::string out(kFrameHeaderSize, '\0');
    encodeFrameHeader(h, reinterpret_cast<uint8_t*>(out.data()));
    return out;
}

// Rewrites the header checksum after a deliberate corruption so the test
// reaches the field checks behind it.
void fixHeaderCrc(std::string* frame) {
    auto* p = reinterpret_cast<uint8_t*>(frame->data());
    uint32_t crc = crc32c(0, p, kFrameHeaderSize - 4);
    for (int i = 0; i < 4; ++i)
        p[kFrameHeaderSize - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

TEST(TcpFrameTest, WriteFrameRoundTrips) {
    std::string payload(1000, 'x');
    std::string frame = encodeFrame(writeHeader(), payload);
    ASSERT_EQ(frame.size(), kFrameHeaderSize + payload.size());
    auto h = validateFrame(bytes(frame), frame.size());
    ASSERT_TRUE(h.ok()) << h.status().toString();
    EXPECT_EQ(h->type, FrameType::kWrite);
    EXPECT_EQ(h->request_id, 42u);
    EXPECT_EQ(h->remote_addr, 0x7f0000001000u);
    EXPECT_EQ(h->length, 3u << 20);
    EXPECT_EQ(h->payload_len, payload.size());
    // The header alone parses before the payload has arrived.
    EXPECT_TRUE(parseFrameHeader(bytes(frame), kFrameHeaderSize).ok());
}

TEST(TcpFrameTest, ControlFramesRoundTrip) {
    for (FrameType t : {FrameType::kPing, FrameType::kPong, FrameType::kCompletion}) {
        FrameHeader h;
        h.type = t;
        h.request_id = 7;
        std::string frame = encodeFrame(h, "");
        auto parsed = validateFrame(bytes(frame), frame.size());
        ASSERT_TRUE(parsed.ok()) << frameTypeName(t) << ": " << parsed.status().toString();
        EXPECT_EQ(parsed->type, t);
    }
    FrameHeader err;
    err.type = FrameType::kError;
    err.status = StatusCode::kPermissionDenied;
    std::string frame = encodeFrame(err, "wrong secret");
    auto parsed = validateFrame(bytes(frame), frame.size());
    ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
    EXPECT_EQ(parsed->status, StatusCode::kPermissionDenied);
}

TEST(TcpFrameTest, HelloPayloadRoundTrips) {
    std::string payload = encodeHello({"s3cret", "segment-a"});
    auto hello = parseHello(payload);
    ASSERT_TRUE(hello.ok());
    EXPECT_EQ(hello->secret, "s3cret");
    EXPECT_EQ(hello->segment_name, "segment-a");
    EXPECT_FALSE(parseHello(payload.substr(0, payload.size() - 1)).ok());
    EXPECT_FALSE(parseHello(payload + "x").ok());
    EXPECT_FALSE(parseHello(encodeHello({std::string(kMaxSecretBytes + 1, 'k'), "a"})).ok());
    FrameHeader h;
    h.type = FrameType::kHello;
    std::string frame = encodeFrame(h, payload);
    EXPECT_TRUE(validateFrame(bytes(frame), frame.size()).ok());
}

TEST(TcpFrameTest, RejectsShortMagicVersionAndChecksum) {
    std::string frame = encodeFrame(writeHeader(), "abc");
    EXPECT_FALSE(parseFrameHeader(bytes(frame), kFrameHeaderSize - 1).ok());
    EXPECT_FALSE(parseFrameHeader(nullptr, 0).ok());
    for (size_t i = 0; i < kFrameHeaderSize; ++i) {
        std::string bad = frame;
        bad[i] = static_cast<char>(bad[i] ^ 0x10);
        EXPECT_FALSE(parseFrameHeader(bytes(bad), bad.size()).ok()) << "flipped byte " << i;
    }
    std::string version = frame;
    version[4] = 2;
    fixHeaderCrc(&version);
    EXPECT_FALSE(parseFrameHeader(bytes(version), version.size()).ok());
}

TEST(TcpFrameTest, RejectsPayloadChecksumAndSizeMismatch) {
    std::string frame = encodeFrame(writeHeader(), "abcdef");
    std::string flipped = frame;
    flipped.back() = 'X';
    EXPECT_FALSE(validateFrame(bytes(flipped), flipped.size()).ok());
    EXPECT_FALSE(validateFrame(bytes(frame), frame.size() - 1).ok());
    std::string longer = frame + "z";
    EXPECT_FALSE(validateFrame(bytes(longer), longer.size()).ok());
}

TEST(TcpFrameTest, RejectsFieldViolations) {
    auto rejects = [](const FrameHeader& h) {
        std::string hdr = rawHeader(h);
        return !parseFrameHeader(bytes(hdr), hdr.size()).ok();
    };
    FrameHeader h = writeHeader();
    h.payload_len = 1 << 20;
    EXPECT_FALSE(rejects(h)) << "a valid slice header";

    FrameHeader t = h;
    t.type = static_cast<FrameType>(0);
    EXPECT_TRUE(rejects(t));
    t.type = static_cast<FrameType>(kMaxFrameType + 1);
    EXPECT_TRUE(rejects(t));

    FrameHeader f = h;
    f.flags = 1;
    EXPECT_TRUE(rejects(f));

    FrameHeader big = h;
    big.payload_len = kMaxFramePayload + 1;
    big.length = big.payload_len;
    EXPECT_TRUE(rejects(big));

    FrameHeader slice = h;
    slice.length = slice.payload_len - 1;  // slice longer than what remains
    EXPECT_TRUE(rejects(slice));

    FrameHeader wrap = h;
    wrap.remote_addr = ~0ull - 10;
    EXPECT_TRUE(rejects(wrap));

    FrameHeader no_id = h;
    no_id.request_id = 0;
    EXPECT_TRUE(rejects(no_id));

    FrameHeader st = h;
    st.status = static_cast<StatusCode>(200);
    EXPECT_TRUE(rejects(st));

    FrameHeader rr;
    rr.type = FrameType::kReadReq;
    rr.request_id = 1;
    rr.length = 0;
    EXPECT_TRUE(rejects(rr));
    rr.length = 10;
    EXPECT_FALSE(rejects(rr));
    rr.payload_len = 10;  // READ_REQ carries no payload
    EXPECT_TRUE(rejects(rr));

    FrameHeader hello;
    hello.type = FrameType::kHello;
    hello.payload_len = kMaxControlPayload + 1;
    EXPECT_TRUE(rejects(hello));
    hello.payload_len = 0;
    EXPECT_TRUE(rejects(hello));

    FrameHeader ok_completion;
    ok_completion.type = FrameType::kCompletion;
    ok_completion.request_id = 3;
    ok_completion.payload_len = 5;  // a message only goes with an error
    EXPECT_TRUE(rejects(ok_completion));

    FrameHeader error;
    error.type = FrameType::kError;  // an ERROR must say what went wrong
    EXPECT_TRUE(rejects(error));
}

}  // namespace
}  // namespace mooncake::te::tcp
