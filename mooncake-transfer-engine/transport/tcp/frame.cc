#include "mooncake-transfer-engine/transport/tcp/frame.h"

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/common/serialize.h"

namespace mooncake::te::tcp {
namespace {

// Field offsets; the static_assert below keeps them in step with the size.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffType = 5;
constexpr size_t kOffFlags = 6;
constexpr size_t kOffStatus = 8;
constexpr size_t kOffPayloadLen = 12;
constexpr size_t kOffRequestId = 16;
constexpr size_t kOffRemoteAddr = 24;
constexpr size_t kOffLength = 32;
constexpr size_t kOffPayloadCrc = 40;
constexpr size_t kOffHeaderCrc = 44;
static_assert(kOffHeaderCrc + sizeof(uint32_t) == kFrameHeaderSize,
              "frame header layout must add up to kFrameHeaderSize");
static_assert(kFrameHeaderSize == 48, "the wire header is 48 bytes");
static_assert(kMaxControlPayload <= kMaxFramePayload);

// Explicit little-endian so the format does not depend on the host.
template <typename T>
void putLe(uint8_t* p, T v) {
    for (size_t i = 0; i < sizeof(T); ++i)
        p[i] = static_cast<uint8_t>(v >> (8 * i));
}
template <typename T>
T getLe(const uint8_t* p) {
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
        v |= static_cast<T>(p[i]) << (8 * i);
    return v;
}

constexpr uint32_t kMaxStatusCode = static_cast<uint32_t>(StatusCode::kInternal);

Status bad(const std::string& what) {
    return InvalidArgument("malformed tcp frame: " + what);
}

bool rangeOverflows(uint64_t addr, uint64_t len) {
    return addr + len < addr;
}

// Per-type rules. Everything the receive path later relies on without
// re-checking (payload bounds, slice arithmetic) is enforced here.
Status checkTypeRules(const FrameHeader& h) {
    const bool ok_status = h.status == StatusCode::kOk;
    switch (h.type) {
        case FrameType::kHello:
            if (h.payload_len == 0 || h.payload_len > kMaxControlPayload)
                return bad("HELLO payload size");
            if (!ok_status || h.length != 0 || h.remote_addr != 0 || h.request_id != 0)
                return bad("HELLO with request fields");
            return Status::OK();
        case FrameType::kHelloAck:
            if (h.payload_len > kMaxControlPayload)
                return bad("HELLO_ACK payload size");
            if (!ok_status || h.length != 0 || h.remote_addr != 0 || h.request_id != 0)
                return bad("HELLO_ACK with request fields");
            return Status::OK();
        case FrameType::kWrite:
        case FrameType::kReadResp:
            if (h.payload_len == 0)
                return bad("empty data frame");
            if (h.length < h.payload_len)
                return bad("slice longer than its request");
            if (rangeOverflows(h.remote_addr, h.length))
                return bad("address range wraps");
            if (!ok_status || h.request_id == 0)
                return bad("data frame without request id");
            return Status::OK();
        case FrameType::kReadReq:
            if (h.payload_len != 0 || h.length == 0)
                return bad("READ_REQ sizes");
            if (rangeOverflows(h.remote_addr, h.length))
                return bad("address range wraps");
            if (!ok_status || h.request_id == 0)
                return bad("READ_REQ without request id");
            return Status::OK();
        case FrameType::kCompletion:
            if (h.request_id == 0)
                return bad("COMPLETION without request id");
            if (h.payload_len > kMaxControlPayload)
                return bad("COMPLETION payload size");
            if (ok_status && h.payload_len != 0)
                return bad("successful COMPLETION with payload");
            return Status::OK();
        case FrameType::kPing:
        case FrameType::kPong:
            if (h.payload_len != 0 || !ok_status || h.request_id == 0)
                return bad("PING/PONG");
            return Status::OK();
        case FrameType::kError:
            if (ok_status)
                return bad("ERROR without a status");
            if (h.payload_len > kMaxControlPayload)
                return bad("ERROR payload size");
            return Status::OK();
    }
    return bad("unknown type");
}

}  // namespace

const char* frameTypeName(FrameType type) {
    switch (type) {
        case FrameType::kHello:
            return "HELLO";
        case FrameType::kHelloAck:
            return "HELLO_ACK";
        case FrameType::kWrite:
            return "WRITE";
        case FrameType::kReadReq:
            return "READ_REQ";
        case FrameType::kReadResp:
            return "READ_RESP";
        case FrameType::kCompletion:
            return "COMPLETION";
        case FrameType::kPing:
            return "PING";
        case FrameType::kPong:
            return "PONG";
        case FrameType::kError:
            return "ERROR";
    }
    return "?";
}

void encodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]) {
    putLe<uint32_t>(out + kOffMagic, kFrameMagic);
    out[kOffVersion] = kFrameVersion;
    out[kOffType] = static_cast<uint8_t>(h.type);
    putLe<uint16_t>(out + kOffFlags, h.flags);
    putLe<uint32_t>(out + kOffStatus, static_cast<uint32_t>(h.status));
    putLe<uint32_t>(out + kOffPayloadLen, h.payload_len);
    putLe<uint64_t>(out + kOffRequestId, h.request_id);
    putLe<uint64_t>(out + kOffRemoteAddr, h.remote_addr);
    putLe<uint64_t>(out + kOffLength, h.length);
    putLe<uint32_t>(out + kOffPayloadCrc, h.payload_crc);
    putLe<uint32_t>(out + kOffHeaderCrc, crc32c(0, out, kOffHeaderCrc));
}

Result<FrameHeader> parseFrameHeader(const uint8_t* data, size_t len) {
    if (data == nullptr || len < kFrameHeaderSize)
        return bad("short header");
    if (getLe<uint32_t>(data + kOffMagic) != kFrameMagic)
        return bad("bad magic");
    if (data[kOffVersion] != kFrameVersion) {
        return bad("unsupported version " + std::to_string(data[kOffVersion]));
    }
    if (getLe<uint32_t>(data + kOffHeaderCrc) != crc32c(0, data, kOffHeaderCrc)) {
        return bad("header checksum mismatch");
    }
    uint8_t type = data[kOffType];
    if (type == 0 || type > kMaxFrameType)
        return bad("unknown type " + std::to_string(type));
    uint32_t status = getLe<uint32_t>(data + kOffStatus);
    if (status > kMaxStatusCode)
        return bad("unknown status " + std::to_string(status));

    FrameHeader h;
    h.type = static_cast<FrameType>(type);
    h.flags = getLe<uint16_t>(data + kOffFlags);
    h.status = static_cast<StatusCode>(status);
    h.payload_len = getLe<uint32_t>(data + kOffPayloadLen);
    h.request_id = getLe<uint64_t>(data + kOffRequestId);
    h.remote_addr = getLe<uint64_t>(data + kOffRemoteAddr);
    h.length = getLe<uint64_t>(data + kOffLength);
    h.payload_crc = getLe<uint32_t>(data + kOffPayloadCrc);
    if (h.flags != 0)
        return bad("reserved flags set");
    if (h.payload_len > kMaxFramePayload) {
        return bad("payload of " + std::to_string(h.payload_len) + " bytes exceeds the bound");
    }
    MC_RETURN_IF_ERROR(checkTypeRules(h));
    return h;
}

Result<FrameHeader> validateFrame(const uint8_t* data, size_t len) {
    MC_ASSIGN_OR_RETURN(FrameHeader h, parseFrameHeader(data, len));
    if (len - kFrameHeaderSize != h.payload_len)
        return bad("frame size differs from header");
    if (crc32c(0, data + kFrameHeaderSize, h.payload_len) != h.payload_crc) {
        return bad("payload checksum mismatch");
    }
    return h;
}

std::string encodeFrame(FrameHeader h, std::string_view payload) {
    h.payload_len = static_cast<uint32_t>(payload.size());
    h.payload_crc = crc32c(0, payload.data(), payload.size());
    std::string out(kFrameHeaderSize, '\0');
    encodeFrameHeader(h, reinterpret_cast<uint8_t*>(out.data()));
    out.append(payload);
    return out;
}

std::string encodeHello(const HelloPayload& hello) {
    ByteWriter w;
    w.putString(hello.secret);
    w.putString(hello.segment_name);
    return w.take();
}

Result<HelloPayload> parseHello(std::string_view payload) {
    ByteReader r(payload);
    HelloPayload hello;
    if (!r.getString(&hello.secret, kMaxSecretBytes) ||
        !r.getString(&hello.segment_name, kMaxSegmentNameBytes) || !r.atEnd()) {
        return bad("HELLO payload");
    }
    return hello;
}

}  // namespace mooncake::te::tcp
