#include "mooncake-transfer-engine/transport/tcp/connection.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::te::tcp {

// Payload bytes per WRITE / READ_RESP frame. Large enough that the header and
// the checksum pass are noise, small enough that a big request does not hold
// the socket for long and that a timed-out write can be finished from a copy.
MC_ENV_INT(TcpSliceBytes, "MC_TCP_SLICE_BYTES", 1 << 20)

namespace {

constexpr size_t kStagingBytes = 256 << 10;
// Payload remainders at least this big bypass the staging buffer and are
// received straight into their destination.
constexpr size_t kDirectRecvBytes = 16 << 10;
// Per-wakeup caps so one busy connection cannot starve the others.
constexpr size_t kReadBudget = 16 << 20;
constexpr size_t kWriteBudget = 16 << 20;
constexpr int kMaxIov = 64;

uint32_t sliceBytes() {
    static const uint32_t slice =
        static_cast<uint32_t>(std::clamp<int64_t>(envTcpSliceBytes(), 4096, kMaxFramePayload));
    return slice;
}

}  // namespace

Connection::Connection(EventLoop* loop, int fd, std::string peer, Delegate* delegate)
    : loop_(loop), fd_(fd), peer_(std::move(peer)), delegate_(delegate), rbuf_(kStagingBytes) {}

Connection::~Connection() {
    if (fd_ >= 0) {
        loop_->unwatch(fd_);
        ::close(fd_);
    }
}

Status Connection::start(bool connecting) {
    connecting_ = connecting;
    interest_ = connecting ? EPOLLOUT : EPOLLIN;
    return loop_->watch(fd_, interest_, this);
}

void Connection::updateInterest() {
    if (fd_ < 0 || connecting_)
        return;
    // While held, EPOLLIN stays off: level-triggered readiness we do not act on
    // would spin the loop.
    uint32_t events = held() ? EPOLLOUT : (out_.empty() ? EPOLLIN : (EPOLLIN | EPOLLOUT));
    if (events == interest_)
        return;
    Status st = loop_->rewatch(fd_, events, this);
    if (!st.ok()) {
        close(Internal("tcp connection to " + peer_ + ": " + st.message()));
        return;
    }
    interest_ = events;
}

bool Connection::held() {
    if (hold_seq_ == 0)
        return false;
    if (!out_.empty() && out_.front().seq <= hold_seq_)
        return true;
    hold_seq_ = 0;
    return false;
}

void Connection::holdReadsUntilSent() {
    if (!out_.empty())
        hold_seq_ = out_.back().seq;
}

void Connection::close(const Status& why) {
    if (fd_ < 0)
        return;
    loop_->unwatch(fd_);
    ::close(fd_);
    fd_ = -1;
    out_.clear();
    MC_LOG(kDebug, "tcp") << "closed connection to " << peer_ << ": " << why.toString();
    delegate_->onClosed(this, why);
}

void Connection::handleEvents(uint32_t events) {
    if (fd_ < 0)
        return;
    if (connecting_) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            finishConnect();
        return;
    }
    // Errors and hang-ups surface through recv() (or send()) with a precise errno.
    pump((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) != 0);
}

void Connection::flush() {
    // From inside a delegate callback: just write; the running pump() does the rest.
    if (in_pump_) {
        doFlush();
        return;
    }
    pump(false);
}

void Connection::pump(bool readable) {
    if (fd_ < 0 || connecting_)
        return;
    in_pump_ = true;
    while (fd_ >= 0) {
        if ((readable || read_blocked_) && !held()) {
            read_blocked_ = false;
            readSome();
        } else if (readable) {
            read_blocked_ = true;
        }
        readable = false;
        if (fd_ >= 0 && !out_.empty())
            doFlush();
        // A hold released by this flush leaves frames in the staging buffer
        // that no epoll event will announce: go round again for them.
        if (fd_ < 0 || !read_blocked_ || held())
            break;
    }
    in_pump_ = false;
    updateInterest();
}

void Connection::finishConnect() {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err != 0) {
        close(PeerFailure("tcp connect to " + peer_ + " failed: " + std::strerror(err)));
        return;
    }
    connecting_ = false;
    delegate_->onConnected(this);
    pump(true);
}

// ---- sending -------------------------------------------------------------------

void Connection::sendControl(FrameHeader h, std::string payload) {
    if (fd_ < 0)
        return;
    OutItem& item = out_.emplace_back();
    item.seq = ++next_seq_;
    item.base = h;
    item.owned = std::move(payload);
    item.total = item.owned.size();
}

void Connection::sendData(FrameType type, uint64_t request_id, uint64_t remote_addr,
                          const uint8_t* data, uint64_t len) {
    if (fd_ < 0 || len == 0)
        return;
    OutItem& item = out_.emplace_back();
    item.seq = ++next_seq_;
    item.base.type = type;
    item.base.request_id = request_id;
    item.base.remote_addr = remote_addr;
    item.sliced = true;
    item.data = data;
    item.total = len;
}

void Connection::encodeNext(OutItem* item) {
    FrameHeader h = item->base;
    if (item->sliced) {
        uint64_t left = item->total - item->next_offset;
        uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(sliceBytes(), left));
        h.remote_addr = item->base.remote_addr + item->next_offset;
        h.length = left;  // lets the target validate the rest of the request at once
        h.payload_len = n;
        item->payload = item->data + item->next_offset;
        item->next_offset += n;
        item->more = item->next_offset < item->total;
    } else {
        h.payload_len = static_cast<uint32_t>(item->owned.size());
        item->payload = reinterpret_cast<const uint8_t*>(item->owned.data());
        item->more = false;
    }
    h.payload_crc = crc32c(0, item->payload, h.payload_len);
    encodeFrameHeader(h, item->hdr);
    item->payload_len = h.payload_len;
    item->written = 0;
    item->has_frame = true;
}

void Connection::doFlush() {
    if (fd_ < 0 || connecting_)
        return;
    size_t budget = kWriteBudget;
    while (!out_.empty() && budget > 0) {
        // Gather whole frames of consecutive items; a sliced item with more
        // frames ends the batch because its next slice must follow in order.
        iovec iov[kMaxIov];
        int cnt = 0;
        size_t bytes = 0;
        for (OutItem& item : out_) {
            if (cnt + 2 > kMaxIov || bytes >= budget)
                break;
            if (!item.has_frame)
                encodeNext(&item);
            size_t w = item.written;
            if (w < kFrameHeaderSize) {
                iov[cnt++] = {item.hdr + w, kFrameHeaderSize - w};
                bytes += kFrameHeaderSize - w;
                w = kFrameHeaderSize;
            }
            size_t pw = w - kFrameHeaderSize;
            if (pw < item.payload_len) {
                iov[cnt++] = {const_cast<uint8_t*>(item.payload) + pw, item.payload_len - pw};
                bytes += item.payload_len - pw;
            }
            if (item.more)
                break;
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(cnt);
        ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            close(PeerFailure("tcp send to " + peer_ + " failed: " + std::strerror(errno)));
            return;
        }
        consume(static_cast<size_t>(n));
        budget -= std::min(budget, static_cast<size_t>(n));
    }
}

void Connection::consume(size_t n) {
    while (n > 0 && !out_.empty()) {
        OutItem& item = out_.front();
        size_t left = kFrameHeaderSize + item.payload_len - item.written;
        if (n < left) {
            item.written += n;
            return;
        }
        n -= left;
        item.has_frame = false;
        if (item.more)
            return;  // its next slice is encoded on the next round
        out_.pop_front();
    }
}

void Connection::abandon(uint64_t request_id) {
    if (rx_state_ == RxState::kPayload && rx_hdr_.request_id == request_id &&
        rx_sink_.kind == PayloadSink::Kind::kMemory) {
        rx_sink_ = PayloadSink::discard();
    }
    for (auto it = out_.begin(); it != out_.end();) {
        if (!it->sliced || it->base.request_id != request_id) {
            ++it;
        } else if (it->has_frame && it->written > 0) {
            // Half on the wire: the frame must be completed to keep the stream
            // in sync, but from our own copy; no further slices follow.
            it->owned.assign(reinterpret_cast<const char*>(it->payload), it->payload_len);
            it->payload = reinterpret_cast<const uint8_t*>(it->owned.data());
            it->data = nullptr;
            it->more = false;
            ++it;
        } else {
            it = out_.erase(it);
        }
    }
}

// ---- receiving -----------------------------------------------------------------

bool Connection::fill(size_t* budget, size_t limit) {
    if (*budget == 0)
        return false;  // the socket stays readable; epoll reports it again
    if (rpos_ > 0) {
        std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
        rend_ -= rpos_;
        rpos_ = 0;
    }
    ssize_t n = ::recv(fd_, rbuf_.data() + rend_, std::min(limit, rbuf_.size() - rend_), 0);
    if (n > 0) {
        rend_ += static_cast<size_t>(n);
        *budget -= std::min(*budget, static_cast<size_t>(n));
        return true;
    }
    if (n == 0) {
        close(PeerFailure("tcp peer " + peer_ + " closed the connection"));
        return false;
    }
    if (errno == EINTR)
        return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return false;
    close(PeerFailure("tcp receive from " + peer_ + " failed: " + std::strerror(errno)));
    return false;
}

void Connection::deliver(const uint8_t* src, size_t n) {
    rx_crc_ = crc32c(rx_crc_, src, n);
    if (rx_sink_.kind == PayloadSink::Kind::kMemory) {
        std::memcpy(rx_sink_.dst + rx_got_, src, n);
    } else if (rx_sink_.kind == PayloadSink::Kind::kBuffer) {
        rx_small_.append(reinterpret_cast<const char*>(src), n);
    }
    rx_got_ += static_cast<uint32_t>(n);
}

void Connection::readSome() {
    // The budget only limits socket reads: frames already staged are always
    // processed, since no epoll event would announce them again.
    size_t budget = kReadBudget;
    while (fd_ >= 0) {
        const size_t avail = rend_ - rpos_;
        if (rx_state_ == RxState::kHeader) {
            if (held()) {
                read_blocked_ = true;
                return;
            }
            if (avail < kFrameHeaderSize) {
                // Replies queued so far (COMPLETIONs) leave before a receive
                // that may find nothing, not after it.
                if (!out_.empty()) {
                    doFlush();
                    if (fd_ < 0)
                        return;
                }
                // After a payload that went straight to memory the next one
                // likely does too: staging more than its header would copy
                // up to a staging buffer's worth of it twice.
                if (!fill(&budget, rx_direct_ ? kFrameHeaderSize - avail : SIZE_MAX))
                    return;
                continue;
            }
            auto h = parseFrameHeader(rbuf_.data() + rpos_, avail);
            if (!h.ok()) {
                close(PeerFailure("tcp peer " + peer_ +
                                  " sent an invalid frame: " + h.status().message()));
                return;
            }
            rpos_ += kFrameHeaderSize;
            rx_hdr_ = h.value();
            rx_got_ = 0;
            rx_crc_ = 0;
            rx_small_.clear();
            rx_sink_ = delegate_->onHeader(this, rx_hdr_);
            if (fd_ < 0)
                return;
            if (rx_sink_.kind == PayloadSink::Kind::kBuffer &&
                rx_hdr_.payload_len > kMaxControlPayload) {
                close(PeerFailure("tcp peer " + peer_ + " sent an oversized " +
                                  frameTypeName(rx_hdr_.type) + " frame"));
                return;
            }
            if (rx_hdr_.payload_len == 0) {
                finishFrame();
                continue;
            }
            rx_state_ = RxState::kPayload;
            continue;
        }
        const size_t need = rx_hdr_.payload_len - rx_got_;
        if (avail > 0) {
            size_t take = std::min(need, avail);
            deliver(rbuf_.data() + rpos_, take);
            rpos_ += take;
        } else if (budget == 0) {
            return;
        } else if (rx_sink_.kind == PayloadSink::Kind::kMemory && need >= kDirectRecvBytes) {
            // The staging buffer is empty: the next frame's header can land at
            // its start in the same call, so a run of data frames costs no
            // extra receive per frame.
            uint8_t* dst = rx_sink_.dst + rx_got_;
            rpos_ = rend_ = 0;
            iovec iov[2] = {{dst, need}, {rbuf_.data(), kFrameHeaderSize}};
            msghdr msg{};
            msg.msg_iov = iov;
            msg.msg_iovlen = 2;
            ssize_t n = ::recvmsg(fd_, &msg, 0);
            if (n <= 0) {
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    return;
                close(PeerFailure(n == 0 ? "tcp peer " + peer_ + " closed the connection"
                                         : "tcp receive from " + peer_ +
                                               " failed: " + std::strerror(errno)));
                return;
            }
            const size_t landed = std::min(need, static_cast<size_t>(n));
            rx_crc_ = crc32c(rx_crc_, dst, landed);
            rx_got_ += static_cast<uint32_t>(landed);
            rend_ = static_cast<size_t>(n) - landed;
            budget -= std::min(budget, static_cast<size_t>(n));
            rx_direct_ = true;
        } else {
            if (!fill(&budget))
                return;
            continue;
        }
        if (rx_got_ == rx_hdr_.payload_len)
            finishFrame();
    }
}

void Connection::finishFrame() {
    rx_state_ = RxState::kHeader;
    rx_direct_ = rx_direct_ && rx_hdr_.payload_len >= kDirectRecvBytes;
    if (rx_crc_ != rx_hdr_.payload_crc) {
        close(PeerFailure("tcp peer " + peer_ + " sent a " + frameTypeName(rx_hdr_.type) +
                          " frame whose payload checksum does not match"));
        return;
    }
    delegate_->onFrame(this, rx_hdr_, rx_small_);
}

}  // namespace mooncake::te::tcp
