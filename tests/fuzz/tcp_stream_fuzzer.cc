// Fuzzes the TCP transport's receive path: Connection reassembling frames
// from a byte stream that arrives in arbitrary pieces, with the payload of
// each frame landing where the delegate says (a small buffer, caller memory
// of exactly payload_len bytes, or nowhere).
//
// The input describes frames (encoded with their checksums by the harness),
// optionally one corrupted byte and raw trailing garbage, how the stream is
// cut into writes, and each frame's sink. The stream goes through a
// socketpair into a real Connection whose events the harness dispatches
// itself (no loop thread). Expected, computed from the description alone:
//  - every frame before the first bad one (invalid header, corrupted byte,
//    oversized buffered payload) is delivered once, in order, with its exact
//    header and payload;
//  - nothing after it is; the connection closes with a peer failure; and
//    when the stream is clean it closes only at EOF ("closed the connection").
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/transport/tcp/connection.h"
#include "mooncake-transfer-engine/transport/tcp/event_loop.h"
#include "mooncake-transfer-engine/transport/tcp/frame.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_require.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using namespace mooncake::te::tcp;
using mooncake::Status;
using mooncake::StatusCode;
using mooncake::fuzz::FuzzInput;

struct Planned {
    FrameHeader header;  // as encoded (payload_crc filled in)
    std::string payload;
    PayloadSink::Kind sink = PayloadSink::Kind::kDiscard;
    size_t end = 0;  // stream offset just past this frame
};

struct Received {
    FrameHeader header;
    std::string payload;  // empty for discarded payloads
};

class Recorder final : public Connection::Delegate {
public:
    explicit Recorder(const std::vector<Planned>* plan) : plan_(plan) {}

    void onConnected(Connection*) override {}
    PayloadSink onHeader(Connection*, const FrameHeader& h) override {
        // The sink the description chose for the frame this header opens.
        MC_FUZZ_REQUIRE(!header_open_);
        header_open_ = true;
        switch (sinkFor(frames.size())) {
            case PayloadSink::Kind::kBuffer:
                return PayloadSink::buffer();
            case PayloadSink::Kind::kMemory:
                // A fresh allocation of exactly payload_len bytes: ASan sees
                // any write past it.
                memory_buf_.reset(new uint8_t[h.payload_len == 0 ? 1 : h.payload_len]);
                return PayloadSink::memory(memory_buf_.get());
            case PayloadSink::Kind::kDiscard:
                break;
        }
        return PayloadSink::discard();
    }
    void onFrame(Connection*, const FrameHeader& h, std::string_view small) override {
        MC_FUZZ_REQUIRE(header_open_);
        header_open_ = false;
        const PayloadSink::Kind sink = sinkFor(frames.size());
        Received r{h, {}};
        if (sink == PayloadSink::Kind::kBuffer) {
            r.payload.assign(small);
        } else {
            MC_FUZZ_REQUIRE(small.empty());
            if (sink == PayloadSink::Kind::kMemory)
                r.payload.assign(reinterpret_cast<const char*>(memory_buf_.get()), h.payload_len);
        }
        frames.push_back(std::move(r));
    }
    void onClosed(Connection*, const Status& why) override {
        MC_FUZZ_REQUIRE(!closed);
        closed = true;
        reason = why;
    }

    std::vector<Received> frames;
    bool closed = false;
    Status reason;

private:
    // Frames the garbage tail happens to form are discarded.
    PayloadSink::Kind sinkFor(size_t i) const {
        return i < plan_->size() ? (*plan_)[i].sink : PayloadSink::Kind::kDiscard;
    }

    const std::vector<Planned>* plan_;
    bool header_open_ = false;
    std::unique_ptr<uint8_t[]> memory_buf_;
};

bool sameHeader(const FrameHeader& a, const FrameHeader& b) {
    return a.type == b.type && a.flags == b.flags && a.status == b.status &&
           a.payload_len == b.payload_len && a.request_id == b.request_id &&
           a.remote_addr == b.remote_addr && a.length == b.length && a.payload_crc == b.payload_crc;
}

// A frame description: mostly valid frames of every type, sizes from empty to
// past the direct-receive threshold, payload bytes a cheap pattern.
Planned readFrame(FuzzInput& in) {
    Planned p;
    FrameHeader& h = p.header;
    h.type = static_cast<FrameType>(1 + in.below(kMaxFrameType));
    h.request_id = in.below(4);
    h.remote_addr = in.u8() & 1 ? in.u64() : 0x100000;
    static const uint32_t kSizes[] = {0, 1, 47, 48, 49, 4095, 4096, 4097, 16383, 16384, 70000};
    uint32_t len = kSizes[in.below(std::size(kSizes))];
    if (in.u8() & 1)
        len = in.u16();
    const uint8_t shape = in.u8();
    h.length = shape & 1 ? len : len + in.u8();
    if (shape & 2)
        h.status = static_cast<StatusCode>(in.below(16));
    p.payload.resize(len);
    const uint8_t fill = in.u8();
    for (uint32_t i = 0; i < len; ++i)
        p.payload[i] = static_cast<char>(fill + i * 7);
    h.payload_len = len;
    h.payload_crc = mooncake::crc32c(0, p.payload.data(), p.payload.size());
    static const PayloadSink::Kind kSinks[] = {
        PayloadSink::Kind::kBuffer, PayloadSink::Kind::kMemory, PayloadSink::Kind::kDiscard};
    p.sink = kSinks[in.below(3)];
    return p;
}

// Writes what the socket takes; the rest waits for the reader.
size_t writeSome(int fd, const std::string& s, size_t from, size_t n) {
    ssize_t w = ::send(fd, s.data() + from, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    return w > 0 ? static_cast<size_t>(w) : 0;
}

EventLoop& loop() {
    // epoll only: handlers are registered but the harness dispatches events.
    static EventLoop* l = [] {
        auto* e = new EventLoop();
        MC_FUZZ_REQUIRE(e->open().ok());
        return e;
    }();
    return *l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzInput in(data, size);
    const uint8_t shape = in.u8();
    std::vector<Planned> plan;
    std::string stream;
    const size_t nframes = in.below(9);
    for (size_t i = 0; i < nframes && stream.size() < (1u << 20); ++i) {
        Planned p = readFrame(in);
        stream += encodeFrame(p.header, p.payload);
        p.end = stream.size();
        plan.push_back(std::move(p));
    }
    // Where the first bad frame is, judged by the rules each piece states.
    size_t bad_at = plan.size();  // index of the first frame not delivered
    size_t corrupt_at = SIZE_MAX;
    if ((shape & 1) && !stream.empty()) {
        corrupt_at = in.below(static_cast<uint32_t>(stream.size()));
        stream[corrupt_at] = static_cast<char>(stream[corrupt_at] ^ (1 + in.below(255)));
    }
    size_t start = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
        const Planned& p = plan[i];
        const uint8_t* raw = reinterpret_cast<const uint8_t*>(stream.data()) + start;
        const bool header_ok = parseFrameHeader(raw, kFrameHeaderSize).ok();
        const bool oversized =
            p.sink == PayloadSink::Kind::kBuffer && p.payload.size() > kMaxControlPayload;
        const bool corrupted = corrupt_at >= start && corrupt_at < p.end;
        if (!header_ok || oversized || corrupted) {
            bad_at = i;
            break;
        }
        start = p.end;
    }
    const std::string garbage = (shape & 2) ? in.bytes(256) : std::string();
    stream += garbage;

    int fds[2];
    MC_FUZZ_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
    Recorder rec(&plan);
    {
        Connection conn(&loop(), fds[0], "fuzz-peer", &rec);
        MC_FUZZ_REQUIRE(conn.start(false).ok());
        // Past the input's end the cut is "all of it", so runs stay short.
        static const size_t kCuts[] = {1u << 20, 1, 7, 47, 48, 49, 4096, 16385};
        size_t sent = 0;
        while (sent < stream.size() && !rec.closed) {
            size_t n = std::min(kCuts[in.below(std::size(kCuts))], stream.size() - sent);
            sent += writeSome(fds[1], stream, sent, n);
            conn.handleEvents(EPOLLIN);
        }
        ::shutdown(fds[1], SHUT_WR);
        conn.handleEvents(EPOLLIN | EPOLLHUP);
        MC_FUZZ_REQUIRE(rec.closed && conn.closed());
    }
    ::close(fds[1]);

    // Frames past a bad one are never delivered; garbage after clean frames
    // may parse as frames the plan does not know, which onHeader rejects.
    MC_FUZZ_REQUIRE(rec.frames.size() == bad_at ||
                    (bad_at == plan.size() && !garbage.empty() && rec.frames.size() >= bad_at));
    for (size_t i = 0; i < bad_at && i < rec.frames.size(); ++i) {
        const Planned& p = plan[i];
        const Received& r = rec.frames[i];
        MC_FUZZ_REQUIRE(sameHeader(r.header, p.header));
        if (p.sink != PayloadSink::Kind::kDiscard)
            MC_FUZZ_REQUIRE(r.payload == p.payload);
    }
    MC_FUZZ_REQUIRE(rec.reason.code() == StatusCode::kPeerFailure);
    const bool clean_eof = rec.reason.message().find("closed the connection") != std::string::npos;
    if (bad_at == plan.size() && garbage.empty())
        MC_FUZZ_REQUIRE(clean_eof);
    if (bad_at < plan.size())
        MC_FUZZ_REQUIRE(!clean_eof);
    return 0;
}

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    // shape, frame count, then per frame: type-1, request id, addr flag,
    // size index, own-size flag, shape, fill, sink; then the cuts.
    auto frame = [](uint8_t type, uint8_t size_idx, uint8_t sink) {
        return std::string{
            static_cast<char>(type - 1), 1, 0, static_cast<char>(size_idx), 0, 1, 'a',
            static_cast<char>(sink)};
    };
    std::string clean = std::string{0, 4} + frame(3, 10, 1) + frame(6, 2, 0) + frame(7, 0, 2) +
                        frame(5, 9, 1) + std::string(16, '\x02');
    std::string corrupt = std::string{1, 3} + frame(3, 3, 1) + frame(6, 1, 0) + frame(5, 5, 2) +
                          std::string{0x40, 0x7f} + std::string(8, '\x00');
    return {clean, corrupt};
}

}  // namespace mooncake::fuzz
