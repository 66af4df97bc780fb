// The rdma metadata blobs: exact round trips, and rejection (with the reason)
// of other versions, truncation, trailing bytes and out-of-range fields.
#include <gtest/gtest.h>

#include "mooncake-transfer-engine/common/serialize.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"

namespace mooncake::te::rdma {
namespace {

RdmaEndpoint sampleEndpoint() {
    RdmaEndpoint e;
    e.device = "mlx5_3";
    e.port = 2;
    e.gid_index = 3;
    e.lid = 0x4321;
    for (int i = 0; i < 16; ++i)
        e.gid[i] = static_cast<uint8_t>(0xf0 + i);
    e.mtu = 5;
    e.link_layer = 2;
    return e;
}

QpMessage sampleMessage() {
    QpMessage m;
    m.kind = QpMessage::kRequest;
    m.from = "rank-7";
    m.nonce = 0x0123456789abcdefull;
    for (int i = 0; i < 16; ++i)
        m.address.gid[i] = static_cast<uint8_t>(i);
    m.address.lid = 9;
    m.address.qpn = 0x00fffffe;
    m.address.psn = 0x00abcdef;
    m.address.mtu = 3;
    return m;
}

TEST(RdmaMetadata, EndpointRoundTrip) {
    const RdmaEndpoint e = sampleEndpoint();
    const std::string bytes = e.serialize();
    // magic 4 + version 2 + name (4 + 6) + port, gid index 2 + lid 2 + gid 16 + mtu, link 2
    EXPECT_EQ(bytes.size(), 4u + 2 + 4 + 6 + 2 + 2 + 16 + 2);
    auto parsed = RdmaEndpoint::parse(bytes);
    ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
    EXPECT_EQ(parsed.value(), e);
}

TEST(RdmaMetadata, RegionKeyRoundTripAndBytes) {
    const RegionKey k{0x00007f0000001000ull, 0x200000, 0xcafef00d};
    const std::string bytes = k.serialize();
    ASSERT_EQ(bytes.size(), 4u + 2 + 8 + 8 + 4);
    // Little-endian throughout, version 1 right after the magic.
    EXPECT_EQ(static_cast<uint8_t>(bytes[4]), 1);
    EXPECT_EQ(static_cast<uint8_t>(bytes[5]), 0);
    EXPECT_EQ(static_cast<uint8_t>(bytes[22]), 0x0d);
    EXPECT_EQ(static_cast<uint8_t>(bytes[25]), 0xca);
    auto parsed = RegionKey::parse(bytes);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed.value(), k);
}

TEST(RdmaMetadata, QpMessageRoundTrip) {
    for (auto kind : {QpMessage::kRequest, QpMessage::kReply}) {
        QpMessage m = sampleMessage();
        m.kind = kind;
        auto parsed = QpMessage::parse(m.serialize());
        ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
        EXPECT_EQ(parsed.value(), m);
    }
    QpMessage refusal = sampleMessage();
    refusal.kind = QpMessage::kReply;
    refusal.address = QpAddress{};
    refusal.error = "ibv_create_qp failed: ENOMEM";
    auto parsed = QpMessage::parse(refusal.serialize());
    ASSERT_TRUE(parsed.ok()) << parsed.status().toString();
    EXPECT_EQ(parsed.value(), refusal);
}

TEST(RdmaMetadata, RejectsOtherVersions) {
    std::string bytes = sampleEndpoint().serialize();
    bytes[4] = 2;  // version 2
    auto parsed = RdmaEndpoint::parse(bytes);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(),
              "rdma endpoint version 2, expected 1 (peers built from different releases?)");
    std::string qp = sampleMessage().serialize();
    qp[4] = 0;
    EXPECT_NE(QpMessage::parse(qp).status().message().find("version 0, expected 1"),
              std::string::npos);
}

TEST(RdmaMetadata, RejectsBadMagicTruncationAndTrailingBytes) {
    const std::string good = sampleMessage().serialize();
    std::string magic = good;
    magic[0] ^= 1;
    EXPECT_EQ(QpMessage::parse(magic).status().message(), "not an rdma QP message (bad magic)");
    EXPECT_EQ(RegionKey::parse(good).status().message(), "not an rdma region key (bad magic)");
    // Every proper prefix fails.
    for (size_t n = 0; n < good.size(); ++n)
        EXPECT_FALSE(QpMessage::parse(good.substr(0, n)).ok()) << "prefix " << n;
    EXPECT_EQ(QpMessage::parse(good.substr(0, good.size() - 1)).status().message(),
              "truncated rdma QP message");
    EXPECT_EQ(QpMessage::parse(good + "x").status().message(),
              "rdma QP message has 1 bytes past its end");
}

TEST(RdmaMetadata, RejectsOutOfRangeFields) {
    QpMessage m = sampleMessage();
    m.address.qpn = 0x01000000;
    EXPECT_EQ(QpMessage::parse(m.serialize()).status().message(),
              "rdma QP message QPN 16777216, expected 1..0xffffff");
    m = sampleMessage();
    m.address.qpn = 0;
    EXPECT_FALSE(QpMessage::parse(m.serialize()).ok());
    m = sampleMessage();
    m.address.psn = 0x01000000;
    EXPECT_EQ(QpMessage::parse(m.serialize()).status().message(),
              "rdma QP message PSN 16777216, expected 0..0xffffff");
    m = sampleMessage();
    m.address.mtu = 6;
    EXPECT_EQ(QpMessage::parse(m.serialize()).status().message(),
              "rdma QP message MTU code 6, expected 1..5 (256..4096 bytes)");
    m = sampleMessage();
    m.from = "";
    EXPECT_EQ(QpMessage::parse(m.serialize()).status().message(),
              "rdma QP message names no sender");
    m = sampleMessage();
    std::string bytes = m.serialize();
    bytes[6] = 3;  // kind
    EXPECT_EQ(QpMessage::parse(bytes).status().message(),
              "rdma QP message kind 3, expected 1 (request) or 2 (reply)");

    RdmaEndpoint e = sampleEndpoint();
    e.port = 0;
    EXPECT_EQ(RdmaEndpoint::parse(e.serialize()).status().message(),
              "rdma endpoint port 0, expected 1..255");
    e = sampleEndpoint();
    e.device = "";
    EXPECT_EQ(RdmaEndpoint::parse(e.serialize()).status().message(),
              "rdma endpoint names no device");
    e = sampleEndpoint();
    e.mtu = 0;
    EXPECT_FALSE(RdmaEndpoint::parse(e.serialize()).ok());

    EXPECT_FALSE(RegionKey::parse(RegionKey{1, 0, 5}.serialize()).ok());
    EXPECT_EQ(RegionKey::parse(RegionKey{UINT64_MAX - 1, 4, 5}.serialize()).status().message(),
              "rdma region key [18446744073709551614, +4) is empty or wraps");
}

TEST(RdmaMetadata, RejectsAnOverlongDeviceName) {
    ByteWriter w;
    w.put<uint32_t>(0x4d435245);
    w.put<uint16_t>(1);
    w.putString(std::string(256, 'm'));
    std::string bytes = w.take();
    bytes += std::string(2 + 2 + 16 + 2, '\1');
    EXPECT_EQ(RdmaEndpoint::parse(bytes).status().message(), "truncated rdma endpoint");
}

}  // namespace
}  // namespace mooncake::te::rdma
