#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/random.h"
#include "mooncake-transfer-engine/transport/tcp/session.h"

namespace mooncake::te::tcp {

ServerSession::ServerSession(EventLoop* loop, TransportHost* host, int fd, std::string peer,
                             Deadline hello_deadline, ClosedFn on_closed)
    : host_(host),
      peer_(std::move(peer)),
      hello_deadline_(hello_deadline),
      on_closed_(std::move(on_closed)),
      conn_(std::make_unique<Connection>(loop, fd, peer_, this)) {}

ServerSession::~ServerSession() = default;

Status ServerSession::start() {
    return conn_->start(false);
}

void ServerSession::close(const Status& why) {
    if (!closed_)
        conn_->close(why);
}

void ServerSession::onClosed(Connection* conn, const Status& why) {
    (void)conn;
    if (closed_)
        return;
    closed_ = true;
    write_use_.release();
    MC_LOG(kDebug, "tcp") << "target side of " << peer_ << " (segment '" << peer_segment_
                          << "') closed: " << why.toString();
    on_closed_(this);
}

void ServerSession::sweep() {
    if (!closed_ && !authenticated_ && hello_deadline_.expired()) {
        MC_LOG(kWarn, "tcp") << "dropping " << peer_ << ": no HELLO before the deadline";
        close(Timeout("tcp peer " + peer_ + " sent no HELLO in time"));
    }
}

void ServerSession::reply(FrameType type, uint64_t request_id, StatusCode code,
                          std::string message) {
    FrameHeader h;
    h.type = type;
    h.request_id = request_id;
    h.status = code;
    if (message.size() > kMaxControlPayload)
        message.resize(kMaxControlPayload);
    conn_->sendControl(h, std::move(message));
}

void ServerSession::reject(StatusCode code, const std::string& reason) {
    MC_LOG(kWarn, "tcp") << "rejecting connection from " << peer_ << ": " << reason;
    reply(FrameType::kError, 0, code, reason);
    // The ERROR normally leaves at once: the socket is fresh and idle.
    conn_->flush();
    conn_->close(Status(code, "rejected tcp peer " + peer_ + ": " + reason));
}

void ServerSession::abortWriteInto(uint64_t region_addr, const std::string& segment_name) {
    if (closed_ || !write_use_.held() || write_use_.regionAddr() != region_addr)
        return;
    // The loop thread is the only one landing payloads, so once the sink is
    // switched to discard no further byte reaches the region.
    conn_->abandon(write_request_);
    write_use_.release();
    failed_request_ = write_request_;
    reply(FrameType::kCompletion, write_request_, StatusCode::kAborted,
          "segment '" + segment_name + "' unregistered the region at " +
              std::to_string(region_addr) + " while this WRITE was landing in it");
}

PayloadSink ServerSession::onHeader(Connection* conn, const FrameHeader& h) {
    if (!authenticated_ && h.type != FrameType::kHello) {
        reject(StatusCode::kPermissionDenied,
               std::string("first frame was ") + frameTypeName(h.type) + ", not HELLO");
        return PayloadSink::discard();
    }
    switch (h.type) {
        case FrameType::kHello:
            if (authenticated_) {
                conn->close(PeerFailure("tcp peer " + peer_ + " sent a second HELLO"));
            }
            return PayloadSink::buffer();
        case FrameType::kWrite:
            if (h.request_id == failed_request_)
                return PayloadSink::discard();
            {
                // h.length covers the rest of the request, so its first slice
                // proves the whole range before any byte lands.
                auto use = host_->memory().beginRemoteUse(h.remote_addr, h.length);
                if (!use.ok()) {
                    failed_request_ = h.request_id;
                    reply(FrameType::kCompletion, h.request_id, StatusCode::kOutOfRange,
                          "WRITE [" + std::to_string(h.remote_addr) + ", +" +
                              std::to_string(h.length) +
                              ") is not inside a remotely accessible region of segment '" +
                              host_->segmentName() + "'");
                    return PayloadSink::discard();
                }
                write_use_ = std::move(use.value());
                write_request_ = h.request_id;
                return PayloadSink::memory(reinterpret_cast<uint8_t*>(h.remote_addr));
            }
        case FrameType::kReadReq:
        case FrameType::kPing:
            return PayloadSink::discard();  // no payload
        default:
            conn->close(PeerFailure("tcp peer " + peer_ + " sent an unexpected " +
                                    frameTypeName(h.type) + " frame"));
            return PayloadSink::discard();
    }
}

void ServerSession::onFrame(Connection* conn, const FrameHeader& h, std::string_view small) {
    switch (h.type) {
        case FrameType::kHello: {
            auto hello = parseHello(small);
            if (!hello.ok()) {
                reject(StatusCode::kInvalidArgument, "malformed HELLO");
                return;
            }
            peer_segment_ = hello->segment_name;
            if (!constantTimeEquals(hello->secret, host_->secret())) {
                reject(StatusCode::kPermissionDenied,
                       "segment '" + peer_segment_ + "' presented the wrong group secret");
                return;
            }
            authenticated_ = true;
            MC_LOG(kDebug, "tcp") << "accepted segment '" << peer_segment_ << "' from " << peer_;
            reply(FrameType::kHelloAck, 0, StatusCode::kOk, host_->segmentName());
            return;
        }
        case FrameType::kWrite:
            write_use_.release();
            if (h.request_id == failed_request_)
                return;
            if (h.length == h.payload_len)
                reply(FrameType::kCompletion, h.request_id);
            return;
        case FrameType::kReadReq:
            if (!host_->memory().remotelyAccessible(h.remote_addr, h.length)) {
                reply(FrameType::kCompletion, h.request_id, StatusCode::kOutOfRange,
                      "READ [" + std::to_string(h.remote_addr) + ", +" + std::to_string(h.length) +
                          ") is not inside a remotely accessible region of segment '" +
                          host_->segmentName() + "'");
                return;
            }
            conn->sendData(FrameType::kReadResp, h.request_id, h.remote_addr,
                           reinterpret_cast<const uint8_t*>(h.remote_addr), h.length);
            // The data is read from memory as it is sent; hold later frames
            // back so a WRITE behind this READ cannot change what it returns.
            conn->holdReadsUntilSent();
            return;
        case FrameType::kPing:
            reply(FrameType::kPong, h.request_id);
            return;
        default:
            return;
    }
}

}  // namespace mooncake::te::tcp
