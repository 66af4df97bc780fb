// Receiver half of the P2P protocol: grant credits (receive-pool chunks) to
// the sender, then copy each acknowledged chunk to the user's buffer.
#include <algorithm>
#include <cstring>
#include <string>

#include "mooncake-pg/core/p2p/engine_impl.h"

namespace mooncake::pg {

using p2p::CreditRecord;
using p2p::InRecv;
using p2p::PeerState;

Status P2PEngine::Impl::receiverPass(int peer, PeerState& ps, bool* progressed) {
    if (mover_)
        MC_RETURN_IF_ERROR(completeTakes(ps, progressed));
    if (ps.recvs.empty())
        return Status::OK();
    MC_RETURN_IF_ERROR(readAcks(peer, ps, progressed));
    return issueCredits(peer, ps, progressed);
}

void P2PEngine::Impl::finishRecv(PeerState& ps, std::shared_ptr<InRecv> r, Status status) {
    if (r->finished)
        return;
    r->finished = true;
    auto it = std::find(ps.recvs.begin(), ps.recvs.end(), r);
    if (it != ps.recvs.end())
        ps.recvs.erase(it);
    if (r->in_flight > 0) {
        // Copies into its buffer are still queued: it completes after them
        // (completeTakes). Only a failure can come while some are.
        r->failure = std::move(status);
        return;
    }
    complete(r->done, std::move(status));
    --ps.live;
    --live_;
}

Status P2PEngine::Impl::completeTakes(PeerState& ps, bool* progressed) {
    while (!ps.takes.empty()) {
        MC_ASSIGN_OR_RETURN(const bool done, mover_->completed(ps.takes.front().ticket));
        if (!done)
            return Status::OK();
        p2p::QueuedTake q = std::move(ps.takes.front());
        ps.takes.pop_front();
        ps.recv_pool.release(q.chunk);
        --q.recv->in_flight;
        *progressed = true;
        if (!q.recv->finished) {
            if (++q.recv->received == q.recv->chunks)
                finishRecv(ps, q.recv, Status::OK());
        } else if (q.recv->in_flight == 0) {
            complete(q.recv->done, q.recv->failure);
            --ps.live;
            --live_;
        }
    }
    return Status::OK();
}

Status P2PEngine::Impl::readAcks(int peer, PeerState& ps, bool* progressed, bool tell_peer) {
    const uint64_t first = ps.acks_read;
    for (;;) {
        p2p::AckSlot a;
        uint64_t seq = ps.acks_read;
        if (!p2p::readSlot(window_, layout_.ackIn(peer, seq), p2p::slotToken(ps.epoch, seq), &a)) {
            break;
        }
        auto found = ps.records.find(a.credit_seq);
        if (found == ps.records.end()) {
            return Internal("ack " + std::to_string(seq) + " names unknown credit " +
                            std::to_string(a.credit_seq));
        }
        ++ps.acks_read;
        ++stats_.acks_received;
        *progressed = true;
        CreditRecord rec = std::move(found->second);
        ps.records.erase(found);
        std::shared_ptr<InRecv> r = std::move(rec.recv);
        const bool reservation_answer = a.status == p2p::kAckOffer ||
                                        a.status == p2p::kAckWithdrawn ||
                                        a.status == p2p::kAckCancelled;
        if (reservation_answer) {
            // Withdrawn and cancelled only settle ring slots; an offer
            // counts only while its recv is still up for grabs.
            if (a.status == p2p::kAckOffer && !r->finished && r->any && !r->cancel_due)
                takeOffer(peer, ps, r);
        } else if (!r->finished) {
            if (a.status == p2p::kAckSizeMismatch || a.message_bytes != r->bytes) {
                finishRecv(
                    ps, r,
                    InvalidArgument("recv of " + std::to_string(r->bytes) + " bytes on rank " +
                                    std::to_string(rank_) + " from rank " + std::to_string(peer) +
                                    " (tag " + std::to_string(r->tag) + ") matched a send of " +
                                    std::to_string(a.message_bytes) + " bytes"));
            } else if (a.status == p2p::kAckAbandoned) {
                finishRecv(ps, r,
                           Aborted("rank " + std::to_string(peer) + " gave up on its send of " +
                                   std::to_string(a.message_bytes) + " bytes (tag " +
                                   std::to_string(r->tag) + ") mid-message"));
            } else if (a.status != p2p::kAckOk || a.length != rec.length) {
                return Internal("ack for credit " + std::to_string(a.credit_seq) + " carries " +
                                std::to_string(a.length) + " bytes, status " +
                                std::to_string(a.status) + "; granted " +
                                std::to_string(rec.length));
            } else if (rec.length > 0 && mover_) {
                // Its order is ready: the recv was granted this chunk only
                // once it was (issueCredits). Counted once the copy has
                // completed, which also releases the chunk (completeTakes).
                const auto chunk = static_cast<uint32_t>(rec.chunk);
                MC_ASSIGN_OR_RETURN(const uint64_t ticket,
                                    mover_->take(peer, ps.recv_pool.offsetOf(chunk),
                                                 r->dst + rec.offset, rec.length, r->order.get()));
                ps.takes.push_back(p2p::QueuedTake{ticket, r, chunk, Clock::now()});
                ++r->in_flight;
                rec.chunk = -1;
            } else {
                if (rec.length > 0) {
                    std::memcpy(r->dst + rec.offset,
                                window_ + layout_.recvPool(peer) +
                                    ps.recv_pool.offsetOf(static_cast<uint32_t>(rec.chunk)),
                                rec.length);
                }
                if (++r->received == r->chunks)
                    finishRecv(ps, r, Status::OK());
            }
        }
        if (rec.chunk >= 0)
            ps.recv_pool.release(static_cast<uint32_t>(rec.chunk));
    }
    if (ps.acks_read == first || !tell_peer)
        return Status::OK();
    // Tells the sender which acks (hence which of its puts) have landed, so
    // it can reuse the staging chunks those puts read.
    return fabric_->putFlag(peer, layout_.cursor(rank_), p2p::cursorWord(ps.epoch, ps.acks_read),
                            controlPutDeadline());
}

Status P2PEngine::Impl::grant(int peer, PeerState& ps, const std::shared_ptr<InRecv>& r,
                              uint32_t kind, int32_t chunk, uint64_t length) {
    const uint64_t seq = ps.credits_issued;
    p2p::CreditSlot s{};
    s.header = s.footer = p2p::slotToken(ps.epoch, seq);
    s.recv_id = r->id;
    s.tag = r->tag;
    s.kind = kind;
    s.pool_offset = chunk >= 0 ? ps.recv_pool.offsetOf(static_cast<uint32_t>(chunk)) : 0;
    s.length = length;
    s.message_offset = kind == p2p::kCreditData ? uint64_t{r->credited} * options_.chunk_bytes : 0;
    s.message_bytes = r->bytes;
    CreditRecord& rec = ps.records[seq];
    rec.recv = r;
    rec.chunk = chunk;
    rec.offset = s.message_offset;
    rec.length = length;
    ++ps.credits_issued;
    return p2p::writeSlot(*fabric_, peer, layout_.creditIn(rank_, seq),
                          window_ + layout_.creditOut(peer, seq), s, controlPutDeadline());
}

Status P2PEngine::Impl::issueCredits(int peer, PeerState& ps, bool* progressed) {
    const uint64_t ring = static_cast<uint64_t>(options_.ring_slots);
    // Whether `slots` more credits fit beside the outstanding ones and the
    // slots kept for cancels.
    auto room = [&](uint64_t slots) {
        return ps.credits_issued - ps.acks_read + ps.cancel_reserved + slots <= ring;
    };
    // Per (peer, tag) the sender binds credits to messages by recv id, in
    // order; so a recv only gets credits once every earlier recv on its tag
    // has all of its own (an any-source reservation: once it is matched).
    // Tags whose head recv is still waiting are collected here.
    std::vector<int> blocked;
    auto is_blocked = [&](int tag) {
        return std::find(blocked.begin(), blocked.end(), tag) != blocked.end();
    };
    for (size_t i = 0; i < ps.recvs.size();) {
        std::shared_ptr<InRecv> rp = ps.recvs[i];
        InRecv& r = *rp;
        if (r.any) {
            if (r.cancel_due) {
                // Written before any later credit on the tag, so the sender
                // unbinds its message before it could bind it to a later recv.
                if (r.reserved) {
                    MC_RETURN_IF_ERROR(grant(peer, ps, rp, p2p::kCreditCancel, -1, 0));
                    --ps.cancel_reserved;  // the slot kept for it is now in use
                }
                finishRecv(ps, rp, Status::OK());  // removes it from ps.recvs
                *progressed = true;
                continue;
            }
            if (!r.reserved && !is_blocked(r.tag)) {
                if (!room(2))
                    return Status::OK();
                MC_RETURN_IF_ERROR(grant(peer, ps, rp, p2p::kCreditReserve, -1, 0));
                ++ps.cancel_reserved;
                r.reserved = true;
                *progressed = true;
            }
            blocked.push_back(r.tag);
            ++i;
            continue;
        }
        if (r.credited == r.chunks || is_blocked(r.tag)) {
            ++i;
            continue;
        }
        if (mover_ && r.credited == 0 && !mover_->ready(r.order.get())) {
            // No pool space for it until its buffer's earlier readers have
            // run: a recv that cannot take data yet holds none of the pool,
            // and its chunks can be copied out as soon as they arrive (an
            // order once ready stays ready).
            blocked.push_back(r.tag);
            ++i;
            continue;
        }
        while (r.credited < r.chunks) {
            if (!room(1))
                return Status::OK();
            uint64_t length = chunkLength(r.bytes, r.credited);
            int32_t chunk = -1;
            if (length > 0) {
                auto c = ps.recv_pool.allocate();
                if (!c)
                    break;
                chunk = static_cast<int32_t>(*c);
            }
            MC_RETURN_IF_ERROR(grant(peer, ps, rp, p2p::kCreditData, chunk, length));
            ++r.credited;
            *progressed = true;
        }
        if (r.credited < r.chunks)
            blocked.push_back(r.tag);
        ++i;
    }
    return Status::OK();
}

}  // namespace mooncake::pg
