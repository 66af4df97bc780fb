// Wire format of the TCP transport. Every message is one frame: a fixed
// 48-byte little-endian header followed by `payload_len` bytes.
//
//   off size field
//     0    4 magic         kFrameMagic
//     4    1 version       kFrameVersion
//     5    1 type          FrameType
//     6    2 flags         must be 0 (reserved)
//     8    4 status        StatusCode of COMPLETION / ERROR, else 0
//    12    4 payload_len   bytes after the header, <= kMaxFramePayload
//    16    8 request_id    initiator-chosen, echoed in replies
//    24    8 remote_addr   target virtual address of this frame's bytes
//    32    8 length        WRITE/READ_RESP: bytes of the request from this
//                          frame to its end (so the last slice has
//                          length == payload_len); READ_REQ: bytes wanted
//    40    4 payload_crc   crc32c of the payload
//    44    4 header_crc    crc32c of bytes [0, 44)
//
// The header carries its own checksum (which covers payload_crc, so the two
// together protect header + payload) because a receiver must trust
// payload_len and remote_addr before the payload arrives: payloads land
// directly in registered memory, never in a staging buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::tcp {

inline constexpr uint32_t kFrameMagic = 0x4654434Du;  // "MCTF" in memory order
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 48;
// Upper bound of one frame's payload; large requests travel as slices.
inline constexpr uint32_t kMaxFramePayload = 4u << 20;
// Upper bound of HELLO / HELLO_ACK / COMPLETION / ERROR payloads.
inline constexpr uint32_t kMaxControlPayload = 4096;
inline constexpr size_t kMaxSecretBytes = 1024;
inline constexpr size_t kMaxSegmentNameBytes = 1024;

enum class FrameType : uint8_t {
    kHello = 1,       // initiator -> target: secret + segment name; first frame
    kHelloAck = 2,    // target -> initiator: target segment name
    kWrite = 3,       // initiator -> target: data for [remote_addr, +payload_len)
    kReadReq = 4,     // initiator -> target: send [remote_addr, +length)
    kReadResp = 5,    // target -> initiator: data of [remote_addr, +payload_len)
    kCompletion = 6,  // target -> initiator: a WRITE finished, or a request failed
    kPing = 7,
    kPong = 8,
    kError = 9,  // either way: fatal for the connection; payload = reason
};
inline constexpr uint8_t kMaxFrameType = 9;

const char* frameTypeName(FrameType type);

struct FrameHeader {
    FrameType type = FrameType::kPing;
    uint16_t flags = 0;
    StatusCode status = StatusCode::kOk;
    uint32_t payload_len = 0;
    uint64_t request_id = 0;
    uint64_t remote_addr = 0;
    uint64_t length = 0;
    uint32_t payload_crc = 0;
};

// Writes the 48 header bytes (magic, version and header_crc included).
// `h.payload_crc` must already describe the payload.
void encodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]);

// Decodes and validates the first kFrameHeaderSize bytes of `data`: magic,
// version, header checksum, type, flags, status, payload bound and the
// per-type field rules. Never reads past `len`; safe on hostile input.
Result<FrameHeader> parseFrameHeader(const uint8_t* data, size_t len);

// Validates one complete frame: header as above, `len` equal to header plus
// payload, and the payload checksum.
Result<FrameHeader> validateFrame(const uint8_t* data, size_t len);

// A whole frame (header + payload) as bytes; for control frames and tests.
std::string encodeFrame(FrameHeader h, std::string_view payload);

struct HelloPayload {
    std::string secret;
    std::string segment_name;
};
std::string encodeHello(const HelloPayload& hello);
Result<HelloPayload> parseHello(std::string_view payload);

}  // namespace mooncake::te::tcp
