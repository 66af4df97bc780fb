// What rdma peers tell each other, and its versioned wire form. Three blobs:
//   RdmaEndpoint  in SegmentDesc.rdma_endpoint: the HCA a segment serves on
//   RegionKey     in RegionDesc.rdma_export:    raddr, length and rkey
//   QpMessage     through the store while connecting: one side's QP address
//                 (GID, LID, QPN, PSN, MTU), as a request or a reply
// Each starts with a magic and a version; parse() rejects another version,
// bytes past the end, truncation and out-of-range fields, naming which
// (these bytes come from other processes: they are fuzzed).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

inline constexpr uint16_t kRdmaMetadataVersion = 1;

// One end of an RC connection.
struct QpAddress {
    uint8_t gid[16] = {};  // all zero on InfiniBand without a GRH
    uint16_t lid = 0;
    uint32_t qpn = 0;  // 24 bits
    uint32_t psn = 0;  // 24 bits
    uint8_t mtu = 3;   // enum ibv_mtu: 1 (256) .. 5 (4096)
    bool operator==(const QpAddress&) const = default;
};

struct RdmaEndpoint {
    std::string device;  // "mlx5_0"
    uint8_t port = 1;
    uint8_t gid_index = 0;
    uint16_t lid = 0;
    uint8_t gid[16] = {};
    uint8_t mtu = 3;
    uint8_t link_layer = 0;  // IBV_LINK_LAYER_*
    bool operator==(const RdmaEndpoint&) const = default;

    std::string serialize() const;
    static Result<RdmaEndpoint> parse(std::string_view bytes);
};

struct RegionKey {
    uint64_t raddr = 0;
    uint64_t length = 0;
    uint32_t rkey = 0;
    bool operator==(const RegionKey&) const = default;

    std::string serialize() const;
    static Result<RegionKey> parse(std::string_view bytes);
};

struct QpMessage {
    enum Kind : uint8_t { kRequest = 1, kReply = 2 };
    Kind kind = kRequest;
    std::string from;    // the sender's segment name
    uint64_t nonce = 0;  // ties a reply to its request
    QpAddress address;
    std::string error;  // a reply refusing the connection says why
    bool operator==(const QpMessage&) const = default;

    std::string serialize() const;
    static Result<QpMessage> parse(std::string_view bytes);
};

}  // namespace mooncake::te::rdma
