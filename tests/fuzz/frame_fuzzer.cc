// Fuzzes the TCP transport's frame parsing: parseFrameHeader, validateFrame
// and parseHello must reject or accept any byte string without reading out
// of bounds, and whatever they accept must satisfy the rules the receive
// path relies on without re-checking.
//
// Input: one mode byte, then the frame bytes. Mode bits ask the harness to
// recompute the payload (bit 1) and header (bit 0) checksums first, so the
// field checks behind the checksums are reachable.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/transport/tcp/frame.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using namespace mooncake::te::tcp;

void putLe32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i)
        p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Aborts (a crash for the fuzzer) when an accepted header breaks a rule.
void require(bool cond) {
    if (!cond)
        std::abort();
}

void checkAccepted(const FrameHeader& h, const uint8_t* raw) {
    require(h.payload_len <= kMaxFramePayload);
    require(static_cast<uint8_t>(h.type) >= 1 && static_cast<uint8_t>(h.type) <= kMaxFrameType);
    switch (h.type) {
        case FrameType::kWrite:
        case FrameType::kReadResp:
            require(h.payload_len >= 1 && h.payload_len <= h.length);
            require(h.remote_addr + h.length >= h.remote_addr);
            require(h.request_id != 0);
            break;
        case FrameType::kReadReq:
            require(h.payload_len == 0 && h.length >= 1);
            require(h.remote_addr + h.length >= h.remote_addr);
            break;
        case FrameType::kHello:
        case FrameType::kHelloAck:
        case FrameType::kCompletion:
        case FrameType::kError:
            require(h.payload_len <= kMaxControlPayload);
            break;
        case FrameType::kPing:
        case FrameType::kPong:
            require(h.payload_len == 0);
            break;
    }
    // Encoding what was parsed reproduces the bytes: no field is ignored.
    uint8_t again[kFrameHeaderSize];
    encodeFrameHeader(h, again);
    require(std::memcmp(again, raw, kFrameHeaderSize) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0)
        return 0;
    const uint8_t mode = data[0];
    std::vector<uint8_t> buf(data + 1, data + size);
    if (buf.size() >= kFrameHeaderSize) {
        if (mode & 2) {
            size_t n = buf.size() - kFrameHeaderSize;
            putLe32(buf.data() + 40, mooncake::crc32c(0, buf.data() + kFrameHeaderSize, n));
        }
        if (mode & 1)
            putLe32(buf.data() + 44, mooncake::crc32c(0, buf.data(), 44));
    }

    auto header = parseFrameHeader(buf.data(), buf.size());
    if (header.ok())
        checkAccepted(header.value(), buf.data());

    auto frame = validateFrame(buf.data(), buf.size());
    if (frame.ok()) {
        require(header.ok());
        require(buf.size() == kFrameHeaderSize + frame->payload_len);
        if (frame->type == FrameType::kHello) {
            std::string_view payload(reinterpret_cast<const char*>(buf.data()) + kFrameHeaderSize,
                                     frame->payload_len);
            auto hello = parseHello(payload);
            if (hello.ok())
                require(encodeHello(hello.value()) == payload);
        }
    }
    // The HELLO payload parser on its own, against raw bytes.
    (void)parseHello(std::string_view(reinterpret_cast<const char*>(data), size).substr(1));
    return 0;
}

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    std::vector<std::string> seeds;
    auto add = [&](FrameHeader h, std::string_view payload) {
        seeds.push_back(std::string(1, '\x03') + encodeFrame(h, payload));
    };
    FrameHeader w;
    w.type = FrameType::kWrite;
    w.request_id = 1;
    w.remote_addr = 0x10000;
    w.length = 300;
    add(w, std::string(100, 'd'));
    FrameHeader rr = w;
    rr.type = FrameType::kReadResp;
    add(rr, std::string(300, 'r'));
    FrameHeader rq;
    rq.type = FrameType::kReadReq;
    rq.request_id = 2;
    rq.remote_addr = 0x20000;
    rq.length = 1 << 20;
    add(rq, "");
    FrameHeader hello;
    hello.type = FrameType::kHello;
    add(hello, encodeHello({"secret", "segment"}));
    FrameHeader ack;
    ack.type = FrameType::kHelloAck;
    add(ack, "peer");
    FrameHeader done;
    done.type = FrameType::kCompletion;
    done.request_id = 3;
    add(done, "");
    done.status = StatusCode::kOutOfRange;
    add(done, "out of range");
    FrameHeader ping;
    ping.type = FrameType::kPing;
    ping.request_id = 4;
    add(ping, "");
    FrameHeader err;
    err.type = FrameType::kError;
    err.status = StatusCode::kPermissionDenied;
    add(err, "wrong secret");
    return seeds;
}

}  // namespace mooncake::fuzz
