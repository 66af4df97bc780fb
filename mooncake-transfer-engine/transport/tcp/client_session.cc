#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/transport/tcp/listener.h"
#include "mooncake-transfer-engine/transport/tcp/session.h"

namespace mooncake::te::tcp {

// ---- ProbeWaiter / Op --------------------------------------------------------------

void ProbeWaiter::complete(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_)
        return;
    done_ = true;
    status_ = std::move(status);
    cv_.notify_all();
}

Status ProbeWaiter::wait(Deadline deadline, const std::string& peer) {
    std::unique_lock<std::mutex> lock(mu_);
    if (deadline.at() == Deadline::Clock::time_point::max()) {
        cv_.wait(lock, [&] { return done_; });  // wait_until(max) would overflow
    } else if (!cv_.wait_until(lock, deadline.at(), [&] { return done_; })) {
        return Timeout("tcp probe of " + peer + " got no answer before the deadline");
    }
    return status_;
}

void Op::finish(Status status) const {
    if (task) {
        task->complete(std::move(status));
    } else if (probe) {
        probe->complete(std::move(status));
    }
}

// ---- ClientSession -------------------------------------------------------------------

ClientSession::ClientSession(EventLoop* loop, TransportHost* host, const SegmentDesc& peer,
                             ClosedFn on_closed)
    : loop_(loop),
      host_(host),
      tcp_host_(peer.tcp_host),
      tcp_port_(peer.tcp_port),
      label_("segment '" + peer.name + "' at " + peer.tcp_host + ":" +
             std::to_string(peer.tcp_port)),
      on_closed_(std::move(on_closed)) {}

ClientSession::~ClientSession() = default;

Status ClientSession::connect(Deadline handshake_deadline) {
    handshake_deadline_ = handshake_deadline;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    // Descriptors carry numeric addresses, so this does not block on DNS.
    int rc = ::getaddrinfo(tcp_host_.c_str(), std::to_string(tcp_port_).c_str(), &hints, &res);
    if (rc != 0)
        return Unavailable("resolving " + label_ + ": " + gai_strerror(rc));
    Status last = Unavailable("no address for " + label_);
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = Internal(std::string("socket: ") + std::strerror(errno));
            continue;
        }
        Status st = setSocketOptions(fd);
        if (!st.ok()) {
            ::close(fd);
            last = st;
            continue;
        }
        int r;
        do {
            r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        } while (r != 0 && errno == EINTR);
        if (r != 0 && errno != EINPROGRESS) {
            last = PeerFailure("tcp connect to " + label_ + " failed: " + std::strerror(errno));
            ::close(fd);
            continue;
        }
        conn_ = std::make_unique<Connection>(loop_, fd, label_, this);
        st = conn_->start(r != 0);
        if (!st.ok()) {
            conn_.reset();
            last = st.withContext("registering connection to " + label_);
            continue;
        }
        ::freeaddrinfo(res);
        MC_LOG(kDebug, "tcp") << "connecting to " << label_;
        if (r == 0)
            onConnected(conn_.get());
        return Status::OK();
    }
    ::freeaddrinfo(res);
    return last;
}

void ClientSession::onConnected(Connection* conn) {
    // Requests wait for HELLO_ACK: a peer that rejects us then closes an idle
    // socket, so its ERROR reaches us instead of being lost to a reset.
    FrameHeader h;
    h.type = FrameType::kHello;
    conn->sendControl(h, encodeHello({host_->secret(), host_->segmentName()}));
}

void ClientSession::enqueue(Op op) {
    if (closed_) {
        op.finish(PeerFailure("tcp connection to " + label_ + " is closed"));
        return;
    }
    if (!ready_) {
        waiting_.push_back(std::move(op));
        return;
    }
    dispatch(std::move(op));
}

void ClientSession::dispatch(Op op) {
    const uint64_t id = next_id_++;
    if (!op.task) {
        FrameHeader h;
        h.type = FrameType::kPing;
        h.request_id = id;
        conn_->sendControl(h);
    } else {
        const TransferRequest& req = op.task->request();
        if (req.opcode == TransferOpcode::kWrite) {
            conn_->sendData(FrameType::kWrite, id, req.target_offset,
                            static_cast<const uint8_t*>(req.source), req.length);
        } else {
            FrameHeader h;
            h.type = FrameType::kReadReq;
            h.request_id = id;
            h.remote_addr = req.target_offset;
            h.length = req.length;
            conn_->sendControl(h);
        }
    }
    pending_.emplace(id, std::move(op));
}

void ClientSession::flush() {
    if (conn_ && !closed_)
        conn_->flush();
}

void ClientSession::close(const Status& why) {
    if (conn_ && !closed_) {
        conn_->close(why);  // reports back through onClosed()
        return;
    }
    onClosed(conn_.get(), why);
}

void ClientSession::onClosed(Connection* conn, const Status& why) {
    (void)conn;
    if (closed_)
        return;
    closed_ = true;
    // Swap out first: finishing an op runs no callbacks into us, but keeps the
    // containers stable regardless.
    std::deque<Op> waiting;
    std::unordered_map<uint64_t, Op> pending;
    waiting.swap(waiting_);
    pending.swap(pending_);
    if (!waiting.empty() || !pending.empty()) {
        MC_LOG(kDebug, "tcp") << "failing " << waiting.size() + pending.size() << " requests to "
                              << label_ << ": " << why.toString();
    }
    for (auto& op : waiting)
        op.finish(why);
    for (auto& [id, op] : pending)
        op.finish(why);
    on_closed_(this);
}

void ClientSession::sweep() {
    if (closed_)
        return;
    if (!ready_ && handshake_deadline_.expired()) {
        close(Timeout("tcp connect/handshake with " + label_ +
                      " did not finish before the deadline"));
        return;
    }
    for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->deadline.expired()) {
            it->finish(Timeout("tcp request to " + label_ + " timed out before being sent"));
            it = waiting_.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.deadline.expired()) {
            // After this the task's buffer may be reused: stop touching it.
            conn_->abandon(it->first);
            it->second.finish(Timeout("tcp request " + std::to_string(it->first) + " to " + label_ +
                                      " timed out"));
            it = pending_.erase(it);
        } else {
            ++it;
        }
    }
}

void ClientSession::protocolError(const std::string& what) {
    conn_->close(PeerFailure("tcp peer " + label_ + " violated the protocol: " + what));
}

PayloadSink ClientSession::onHeader(Connection* conn, const FrameHeader& h) {
    (void)conn;
    switch (h.type) {
        case FrameType::kHelloAck:
            if (ready_)
                protocolError("second HELLO_ACK");
            return PayloadSink::buffer();
        case FrameType::kError:
        case FrameType::kCompletion:
            return PayloadSink::buffer();
        case FrameType::kPong:
            return PayloadSink::discard();
        case FrameType::kReadResp: {
            auto it = pending_.find(h.request_id);
            // A late slice of a request that already failed: drop it.
            if (it == pending_.end())
                return PayloadSink::discard();
            Op& op = it->second;
            if (!op.isRead()) {
                protocolError("READ_RESP for a non-READ request");
                return PayloadSink::discard();
            }
            const TransferRequest& req = op.task->request();
            // Slices arrive in order, so each must start where the last ended
            // and agree with the request about what remains; this also keeps
            // the landing range inside the caller's buffer.
            uint64_t off = h.remote_addr - req.target_offset;
            if (h.remote_addr < req.target_offset || off != op.received ||
                h.length != req.length - off) {
                protocolError("READ_RESP slice does not match its request");
                return PayloadSink::discard();
            }
            return PayloadSink::memory(static_cast<uint8_t*>(req.source) + off);
        }
        default:
            protocolError(std::string("unexpected ") + frameTypeName(h.type) + " frame");
            return PayloadSink::discard();
    }
}

void ClientSession::onFrame(Connection* conn, const FrameHeader& h, std::string_view small) {
    switch (h.type) {
        case FrameType::kHelloAck: {
            ready_ = true;
            MC_LOG(kDebug, "tcp") << "connected to " << label_ << " (peer calls itself '" << small
                                  << "')";
            std::deque<Op> waiting;
            waiting.swap(waiting_);
            for (auto& op : waiting)
                dispatch(std::move(op));
            return;
        }
        case FrameType::kError:
            conn->close(Status(
                h.status, "tcp peer " + label_ + " refused the connection: " + std::string(small)));
            return;
        case FrameType::kCompletion: {
            auto it = pending_.find(h.request_id);
            if (it == pending_.end())
                return;  // already timed out
            if (h.status == StatusCode::kOk && it->second.isRead()) {
                protocolError("successful COMPLETION for a READ");
                return;
            }
            Op op = std::move(it->second);
            pending_.erase(it);
            if (h.status == StatusCode::kOk) {
                op.finish(Status::OK());
            } else {
                conn->abandon(h.request_id);
                op.finish(Status(h.status, "tcp peer " + label_ + ": " + std::string(small)));
            }
            return;
        }
        case FrameType::kReadResp: {
            auto it = pending_.find(h.request_id);
            if (it == pending_.end())
                return;
            it->second.received += h.payload_len;
            if (h.length == h.payload_len) {  // the last slice
                it->second.finish(Status::OK());
                pending_.erase(it);
            }
            return;
        }
        case FrameType::kPong: {
            auto it = pending_.find(h.request_id);
            if (it == pending_.end())
                return;
            if (it->second.task) {
                protocolError("PONG for a transfer");
                return;
            }
            it->second.finish(Status::OK());
            pending_.erase(it);
            return;
        }
        default:
            return;  // onHeader() already refused anything else
    }
}

}  // namespace mooncake::te::tcp
