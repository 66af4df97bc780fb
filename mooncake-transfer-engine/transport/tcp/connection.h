// One TCP socket carrying frames: a send queue that writes user memory
// straight to the socket (no staging copies) and a receive state machine that
// lands payloads where the owner says, usually straight in registered memory.
// The protocol roles (initiator and target) are Delegates; this class only
// knows framing. Loop thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/tcp/event_loop.h"
#include "mooncake-transfer-engine/transport/tcp/frame.h"

namespace mooncake::te::tcp {

// Where the payload of the frame being received goes.
struct PayloadSink {
    enum class Kind : uint8_t { kBuffer, kMemory, kDiscard };
    Kind kind = Kind::kDiscard;
    uint8_t* dst = nullptr;  // kMemory: payload_len writable bytes

    static PayloadSink buffer() { return {Kind::kBuffer, nullptr}; }
    static PayloadSink memory(uint8_t* dst) { return {Kind::kMemory, dst}; }
    static PayloadSink discard() { return {Kind::kDiscard, nullptr}; }
};

class Connection final : public EventHandler {
public:
    class Delegate {
    public:
        virtual ~Delegate() = default;
        // An outgoing connect completed; frames queued so far start flowing.
        virtual void onConnected(Connection* conn) = 0;
        // A checked header arrived: choose where its payload goes. kBuffer is
        // for control payloads only (<= kMaxControlPayload). May close `conn`.
        virtual PayloadSink onHeader(Connection* conn, const FrameHeader& h) = 0;
        // The whole frame arrived with a matching checksum. `small` is the
        // payload for kBuffer sinks, empty otherwise. May close `conn`.
        virtual void onFrame(Connection* conn, const FrameHeader& h, std::string_view small) = 0;
        // Called exactly once, from close(); `why` names the peer.
        virtual void onClosed(Connection* conn, const Status& why) = 0;
    };

    // Takes ownership of `fd` (non-blocking). `peer` names the other end in
    // every error this connection reports.
    Connection(EventLoop* loop, int fd, std::string peer, Delegate* delegate);
    ~Connection() override;
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    // Registers with the loop; `connecting`: a non-blocking connect is underway.
    Status start(bool connecting);

    const std::string& peer() const { return peer_; }
    bool closed() const { return fd_ < 0; }
    bool connecting() const { return connecting_; }
    bool idle() const { return out_.empty(); }

    // Queues one frame; `payload` is copied (control payloads are small).
    void sendControl(FrameHeader h, std::string payload = {});
    // Queues [data, data + len) for remote_addr as a run of `type` frames of at
    // most one slice each. `data` must stay valid until the frames are written
    // or abandon(request_id) is called.
    void sendData(FrameType type, uint64_t request_id, uint64_t remote_addr, const uint8_t* data,
                  uint64_t len);
    // Writes what the socket accepts now; the rest goes out on EPOLLOUT.
    void flush();
    // Processes no further incoming frame until everything queued so far has
    // been written. The target calls it after queueing READ data, which is
    // read from memory only as it is sent, so a later WRITE on the connection
    // cannot overtake the READ.
    void holdReadsUntilSent();
    // Stops touching the memory of `request_id` (it failed or timed out): its
    // queued frames are dropped, a half-written frame is finished from a copy,
    // and an incoming payload for it is discarded instead of landed.
    void abandon(uint64_t request_id);
    // Idempotent; reports `why` to the delegate once.
    void close(const Status& why);

    void handleEvents(uint32_t events) override;

private:
    struct OutItem {
        FrameHeader base;  // type, request id, status, start address
        bool sliced = false;
        const uint8_t* data = nullptr;
        uint64_t total = 0;        // payload bytes over all frames
        uint64_t next_offset = 0;  // where the next frame to encode starts
        bool more = true;          // a frame remains to be encoded
        std::string owned;         // control payload or an abandoned frame's copy
        // The encoded frame being written.
        bool has_frame = false;
        uint8_t hdr[kFrameHeaderSize];
        const uint8_t* payload = nullptr;
        uint32_t payload_len = 0;
        size_t written = 0;  // of header + payload
        uint64_t seq = 0;
    };

    // Reads and writes until neither can progress; every entry point ends here.
    void pump(bool readable);
    void finishConnect();
    void readSome();
    void doFlush();
    bool held();
    void updateInterest();
    // Reads at most `limit` bytes into the staging buffer; false when the
    // caller must stop reading.
    bool fill(size_t* budget, size_t limit = SIZE_MAX);
    void deliver(const uint8_t* src, size_t n);
    void finishFrame();
    void encodeNext(OutItem* item);
    void consume(size_t n);

    EventLoop* loop_;
    int fd_;
    std::string peer_;
    Delegate* delegate_;
    bool connecting_ = false;
    uint32_t interest_ = 0;

    std::deque<OutItem> out_;
    uint64_t next_seq_ = 0;
    uint64_t hold_seq_ = 0;      // reads wait until items up to this seq are sent
    bool read_blocked_ = false;  // a read was skipped because of the hold
    bool in_pump_ = false;

    enum class RxState : uint8_t { kHeader, kPayload };
    RxState rx_state_ = RxState::kHeader;
    std::vector<uint8_t> rbuf_;
    size_t rpos_ = 0;
    size_t rend_ = 0;
    FrameHeader rx_hdr_;
    PayloadSink rx_sink_;
    uint32_t rx_got_ = 0;
    uint32_t rx_crc_ = 0;
    std::string rx_small_;
    // The last payload was received straight into memory.
    bool rx_direct_ = false;
};

}  // namespace mooncake::te::tcp
