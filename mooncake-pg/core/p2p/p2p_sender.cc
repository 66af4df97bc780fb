// Sender half of the P2P protocol: stage messages into the send pool, read
// credits, put chunks into the receiver's pool and acknowledge them.
#include <algorithm>
#include <cstring>
#include <string>

#include "mooncake-pg/core/p2p/engine_impl.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

using p2p::Credit;
using p2p::OutMsg;
using p2p::PeerState;
using p2p::SendTag;

namespace {

Status sizeMismatch(int rank, int peer, int tag, size_t send_bytes, size_t recv_bytes) {
    return InvalidArgument("send of " + std::to_string(send_bytes) + " bytes from rank " +
                           std::to_string(rank) + " to rank " + std::to_string(peer) + " (tag " +
                           std::to_string(tag) + ") matched a recv of " +
                           std::to_string(recv_bytes) + " bytes");
}

template <typename Seq, typename T>
void eraseOne(Seq& seq, const T& value) {
    auto it = std::find(seq.begin(), seq.end(), value);
    if (it != seq.end())
        seq.erase(it);
}

}  // namespace

Status P2PEngine::Impl::senderPass(int peer, PeerState& ps, bool* progressed) {
    if (mover_)
        MC_RETURN_IF_ERROR(completePuts(peer, ps, progressed));
    if (ps.tags.empty() && ps.staging.empty())
        return Status::OK();
    releaseStaging(peer, ps, progressed);
    MC_RETURN_IF_ERROR(readCredits(peer, ps, progressed));
    // Serve credits before staging, so that a size mismatch fails a send
    // whose recv is already known instead of completing it; serve again to
    // put chunks that were just staged.
    MC_RETURN_IF_ERROR(serveCredits(peer, ps, progressed));
    bool staged = false;
    stage(peer, ps, &staged);
    if (staged) {
        *progressed = true;
        MC_RETURN_IF_ERROR(serveCredits(peer, ps, progressed));
    }
    return Status::OK();
}

void P2PEngine::Impl::releaseStaging(int peer, PeerState& ps, bool* progressed) {
    if (ps.unreleased.empty())
        return;
    uint64_t consumed = p2p::cursorCount(loadFlag(window_, layout_.cursor(peer)), ps.epoch);
    while (!ps.unreleased.empty() && ps.unreleased.front().first < consumed) {
        ps.send_pool.release(ps.unreleased.front().second);
        ps.unreleased.pop_front();
        *progressed = true;
    }
}

Status P2PEngine::Impl::readCredits(int peer, PeerState& ps, bool* progressed) {
    for (;;) {
        Credit c;
        c.seq = ps.credits_read;
        if (!p2p::readSlot(window_, layout_.creditIn(peer, c.seq), p2p::slotToken(ps.epoch, c.seq),
                           &c.slot)) {
            return Status::OK();
        }
        ++ps.credits_read;
        ++stats_.credits_received;
        *progressed = true;
        const p2p::CreditSlot& s = c.slot;
        bool valid = s.length <= options_.chunk_bytes && s.message_offset <= s.message_bytes &&
                     s.length <= s.message_bytes - s.message_offset &&
                     s.message_offset % options_.chunk_bytes == 0 &&
                     (s.length == 0 || (s.pool_offset <= options_.pool_bytes_per_peer &&
                                        s.length <= options_.pool_bytes_per_peer - s.pool_offset));
        if (!valid) {
            return Internal(
                "corrupt credit " + std::to_string(c.seq) + " (length " + std::to_string(s.length) +
                ", offset " + std::to_string(s.message_offset) + " of " +
                std::to_string(s.message_bytes) + "); are P2POptions equal on all ranks?");
        }
        if (s.kind > p2p::kCreditCancel) {
            return Internal("credit " + std::to_string(c.seq) + " has unknown kind " +
                            std::to_string(s.kind) + "; do all ranks run the same build?");
        }
        // A cancel is taken at once: the reservation it withdraws may sit
        // behind credits that wait for a send.
        if (s.kind == p2p::kCreditCancel) {
            MC_RETURN_IF_ERROR(takeCancel(peer, ps, c));
            continue;
        }
        ps.tags[s.tag].credits.push_back(c);
    }
}

Status P2PEngine::Impl::serveCredits(int peer, PeerState& ps, bool* progressed) {
    for (auto it = ps.tags.begin(); it != ps.tags.end();) {
        SendTag& t = it->second;
        if (!t.credits.empty())
            MC_RETURN_IF_ERROR(serveTag(peer, ps, it->first, t, progressed));
        // A poisoned binding must survive until the recv's last credit.
        bool keep =
            !t.credits.empty() || !t.msgs.empty() || (t.bound && t.bound_status != p2p::kAckOk);
        it = keep ? std::next(it) : ps.tags.erase(it);
    }
    return Status::OK();
}

Status P2PEngine::Impl::serveTag(int peer, PeerState& ps, int tag, SendTag& t, bool* progressed) {
    while (!t.credits.empty()) {
        const Credit& c = t.credits.front();
        const bool reservation = c.slot.kind == p2p::kCreditReserve;
        if (t.offered && t.bound && c.slot.recv_id == t.bound_id && !reservation) {
            // The receiver picked this rank for the offered message: data
            // credits follow, carrying the recv's size.
            t.offered = false;
            if (t.bound_status == p2p::kAckOk && !t.msgs.empty() &&
                c.slot.message_bytes != t.msgs.front()->bytes) {
                auto m = t.msgs.front();
                t.bound_status = p2p::kAckSizeMismatch;
                t.bound_sender_bytes = m->bytes;
                dropMsg(ps, m, sizeMismatch(rank_, peer, tag, m->bytes, c.slot.message_bytes));
            }
        } else if (!t.bound || c.slot.recv_id != t.bound_id) {
            // A new recv. If the previous one still had chunks to come, the
            // receiver gave up on it (its deadline): drop the rest.
            if (t.bound && t.bound_status == p2p::kAckOk && !t.offered && !t.msgs.empty()) {
                dropMsg(ps, t.msgs.front(),
                        Aborted("rank " + std::to_string(peer) +
                                " abandoned the matching recv (tag " + std::to_string(tag) + ")"));
            }
            t.bound = false;
            t.offered = false;
            if (t.msgs.empty())
                return Status::OK();  // wait for a send
            if (c.slot.message_offset != 0) {
                return Internal("credit for a new recv starts at offset " +
                                std::to_string(c.slot.message_offset));
            }
            auto m = t.msgs.front();
            t.bound = true;
            t.bound_id = c.slot.recv_id;
            t.bound_status = p2p::kAckOk;
            if (reservation) {
                // Offered, not sent: the receiver may pick another sender.
                // It compares the sizes once it picks this one.
                t.offered = true;
                MC_RETURN_IF_ERROR(writeAck(peer, ps, c, p2p::kAckOffer, 0, m->bytes));
                t.credits.pop_front();
                *progressed = true;
                continue;
            }
            if (c.slot.message_bytes != m->bytes) {
                t.bound_status = p2p::kAckSizeMismatch;
                t.bound_sender_bytes = m->bytes;
                dropMsg(ps, m, sizeMismatch(rank_, peer, tag, m->bytes, c.slot.message_bytes));
            }
        }
        if (t.bound_status != p2p::kAckOk) {
            MC_RETURN_IF_ERROR(writeAck(peer, ps, c, t.bound_status, 0, t.bound_sender_bytes));
            t.credits.pop_front();
            *progressed = true;
            continue;
        }
        OutMsg& m = *t.msgs.front();
        uint32_t index = static_cast<uint32_t>(c.slot.message_offset / options_.chunk_bytes);
        if (index != m.sent || c.slot.length != chunkLength(m.bytes, index)) {
            return Internal("credit for chunk " + std::to_string(index) + " (" +
                            std::to_string(c.slot.length) + " bytes) does not fit chunk " +
                            std::to_string(m.sent) + " of a " + std::to_string(m.bytes) +
                            "-byte message");
        }
        if (index >= m.staged)
            return Status::OK();  // wait for staging
        if (c.slot.length > 0 && mover_ && !mover_->ready(m.order.get()))
            return Status::OK();  // its producer is still running
        if (c.slot.length > 0 && mover_) {
            // Acknowledged once the put has completed (completePuts).
            MC_ASSIGN_OR_RETURN(
                const uint64_t ticket,
                mover_->put(peer, c.slot.pool_offset, m.src + size_t{index} * options_.chunk_bytes,
                            c.slot.length, m.order.get()));
            ps.puts.push_back(p2p::QueuedPut{ticket, c, t.msgs.front(), Clock::now()});
            ++m.in_flight;
        } else if (c.slot.length > 0) {
            auto chunk = static_cast<uint32_t>(m.slot[index]);
            MC_RETURN_IF_ERROR(
                fabric_->put(peer, layout_.recvPool(rank_) + c.slot.pool_offset,
                             window_ + layout_.sendPool(peer) + ps.send_pool.offsetOf(chunk),
                             c.slot.length, m.deadline));
            ps.unreleased.emplace_back(ps.acks_written, chunk);
            m.slot[index] = -1;
        }
        if (!mover_ || c.slot.length == 0) {
            MC_RETURN_IF_ERROR(writeAck(peer, ps, c, p2p::kAckOk, c.slot.length, m.bytes));
            if (mover_)
                ++m.landed;
        }
        t.credits.pop_front();
        *progressed = true;
        if (++m.sent == m.chunks) {
            std::shared_ptr<OutMsg> sent = t.msgs.front();
            t.msgs.pop_front();
            t.bound = false;
            if (mover_) {
                settleMsg(ps, sent);  // once its data has landed
            } else {
                // Delivered. Staging finished earlier, so `done` has fired.
                --ps.live;
                --live_;
            }
        }
    }
    return Status::OK();
}

void P2PEngine::Impl::stage(int peer, PeerState& ps, bool* progressed) {
    if (mover_) {
        // Nothing to stage: puts read the user's buffer, which stays the
        // engine's until the send completes.
        for (auto& m : ps.staging) {
            if (m->staged < m->chunks) {
                m->staged = m->chunks;
                *progressed = true;
            }
        }
        return;
    }
    uint8_t* pool = window_ + layout_.sendPool(peer);
    for (auto it = ps.staging.begin(); it != ps.staging.end();) {
        OutMsg& m = **it;
        while (m.staged < m.chunks) {
            if (m.bytes == 0) {
                m.staged = 1;
                break;
            }
            auto chunk = ps.send_pool.allocate();
            if (!chunk)
                break;
            std::memcpy(pool + ps.send_pool.offsetOf(*chunk),
                        m.src + size_t{m.staged} * options_.chunk_bytes,
                        chunkLength(m.bytes, m.staged));
            m.slot[m.staged++] = static_cast<int32_t>(*chunk);
            *progressed = true;
        }
        if (m.staged < m.chunks) {
            ++it;
            continue;
        }
        // The data is ours now: the caller may reuse its buffer.
        m.src = nullptr;
        complete(m.done, Status::OK());
        *progressed = true;
        it = ps.staging.erase(it);
    }
}

Status P2PEngine::Impl::writeAck(int peer, PeerState& ps, const Credit& c, uint32_t status,
                                 uint64_t length, uint64_t message_bytes) {
    p2p::AckSlot a{};
    a.header = a.footer = p2p::slotToken(ps.epoch, ps.acks_written);
    a.credit_seq = c.seq;
    a.length = length;
    a.message_bytes = message_bytes;
    a.status = status;
    MC_RETURN_IF_ERROR(p2p::writeSlot(*fabric_, peer, layout_.ackIn(rank_, ps.acks_written),
                                      window_ + layout_.ackOut(peer, ps.acks_written), a,
                                      controlPutDeadline()));
    ++ps.acks_written;
    return Status::OK();
}

void P2PEngine::Impl::dropMsg(PeerState& ps, std::shared_ptr<OutMsg> m, const Status& status) {
    // Chunks already put belong to `unreleased`; the others were never read.
    for (uint32_t i = m->sent; i < m->staged; ++i) {
        if (m->slot[i] >= 0)
            ps.send_pool.release(static_cast<uint32_t>(m->slot[i]));
        m->slot[i] = -1;
    }
    eraseOne(ps.staging, m);
    auto t = ps.tags.find(m->tag);
    if (t != ps.tags.end())
        eraseOne(t->second.msgs, m);
    if (mover_) {
        // Its queued puts still read the buffer: it completes after them.
        m->dropped = true;
        m->failure = status;
        settleMsg(ps, m);
        return;
    }
    if (m->done) {
        complete(m->done, status);
    } else {
        MC_LOG(kWarn, "pg") << "P2P: a completed send failed later: " << status.toString();
    }
    --ps.live;
    --live_;
}

void P2PEngine::Impl::timeoutSend(int peer, PeerState& ps, std::shared_ptr<OutMsg> m) {
    SendTag& t = ps.tags[m->tag];
    const bool bound =
        t.bound && t.bound_status == p2p::kAckOk && !t.msgs.empty() && t.msgs.front() == m;
    const bool data_not_ready = mover_ && bound && !mover_->ready(m->order.get());
    if (bound) {
        // The receiver is mid-message: answer its remaining credits with
        // "abandoned" so it fails now rather than at its own deadline. Those
        // already here are answered at once: with the message gone the pair
        // may have nothing else in flight, and an idle pair is not polled.
        t.bound_status = p2p::kAckAbandoned;
        t.bound_sender_bytes = m->bytes;
        while (!t.credits.empty() && t.credits.front().slot.recv_id == t.bound_id &&
               t.credits.front().slot.kind == p2p::kCreditData) {
            if (!writeAck(peer, ps, t.credits.front(), p2p::kAckAbandoned, 0, m->bytes).ok())
                break;  // the pair is failing anyway
            t.credits.pop_front();
        }
    }
    const std::string chunks = std::to_string(m->chunks) + " chunks";
    const std::string progress =
        data_not_ready ? "its recv was posted, but its data never became ready (put " +
                             std::to_string(m->sent) + " of " + chunks +
                             "; its producer on the caller's stream had not finished)"
        : mover_
            ? "put " + std::to_string(m->sent) + " of " + chunks + " (no matching recv posted?)"
            : "staged " + std::to_string(m->staged) + " of " + chunks +
                  "; the send pool is full (no matching recv posted?)";
    dropMsg(ps, m,
            Timeout("send of " + std::to_string(m->bytes) + " bytes to rank " +
                    std::to_string(peer) + " (tag " + std::to_string(m->tag) + "): " + progress));
}

Status P2PEngine::Impl::completePuts(int peer, PeerState& ps, bool* progressed) {
    while (!ps.puts.empty()) {
        MC_ASSIGN_OR_RETURN(const bool done, mover_->completed(ps.puts.front().ticket));
        if (!done)
            return Status::OK();
        p2p::QueuedPut q = std::move(ps.puts.front());
        ps.puts.pop_front();
        --q.msg->in_flight;
        *progressed = true;
        const bool dropped = q.msg->dropped;
        if (!dropped)
            ++q.msg->landed;
        // Settled before the ack is written: should that write fail, the
        // pair fails and the message, no longer queued anywhere, would be
        // left without a completion.
        settleMsg(ps, q.msg);
        MC_RETURN_IF_ERROR(
            dropped
                ? writeAck(peer, ps, q.credit, p2p::kAckAbandoned, 0, q.msg->bytes)
                : writeAck(peer, ps, q.credit, p2p::kAckOk, q.credit.slot.length, q.msg->bytes));
    }
    return Status::OK();
}

void P2PEngine::Impl::settleMsg(PeerState& ps, const std::shared_ptr<OutMsg>& m) {
    if (m->settled || m->in_flight > 0 || (!m->dropped && m->landed < m->chunks))
        return;
    m->settled = true;
    eraseOne(ps.staging, m);
    complete(m->done, m->dropped ? m->failure : Status::OK());
    --ps.live;
    --live_;
}

}  // namespace mooncake::pg
