// Any-source recvs on the receiver-driven credit protocol.
//
// A receiver cannot grant pool space to a sender it has not chosen, so an
// any-source recv first asks: it writes a reservation credit (no pool space)
// on the tag to every candidate peer, each in its turn among that peer's
// recvs. A sender with a message on the tag binds it to the reservation and
// answers with an offer (the message's size, no data). The first offer the
// receiver reads wins: that peer's reservation entry becomes an ordinary recv
// (data credits with the same recv id), and every other reservation is
// withdrawn with a cancel credit, which unbinds an offered message so it
// goes to the sender's next recv on the tag. Until a reservation is settled,
// later recvs on its (peer, tag) get no credits, so per sender and tag
// messages still match recvs in posting order.
//
// Bounded: a written reservation keeps a second ring slot for its cancel
// (PeerState::cancel_reserved), so withdrawing never waits for ring space.
#include <algorithm>
#include <string>

#include "mooncake-pg/core/p2p/engine_impl.h"

namespace mooncake::pg {

using p2p::AnyRecv;
using p2p::InRecv;
using p2p::PeerState;

Status P2PEngine::Impl::recvAny(void* buf, size_t bytes, int tag, Deadline deadline,
                                AnyCallback done, std::shared_ptr<const P2POrder> order) {
    if (buf == nullptr && bytes > 0)
        return InvalidArgument("recv from any rank: null buffer");
    if (!init_status_.ok())
        return init_status_;
    if (bytes > 0 && (bytes - 1) / options_.chunk_bytes >= UINT32_MAX) {
        return InvalidArgument("recv of " + std::to_string(bytes) + " bytes: too many chunks");
    }
    auto any = std::make_shared<AnyRecv>();
    any->tag = tag;
    any->bytes = bytes;
    any->deadline = deadline;
    any->done = std::move(done);

    std::lock_guard<std::mutex> lock(mu_);
    if (stop_)
        return Aborted("P2P engine is shutting down");
    if (!active_[rank_]) {
        return Unavailable("this rank (" + std::to_string(rank_) +
                           ") is not an active member; P2P starts once it is activated");
    }
    for (int p = 0; p < size_; ++p) {
        if (p == rank_ || !active_[p] || !peers_[p].broken.ok() || fabric_->peerFailed(p))
            continue;
        auto r = std::make_shared<InRecv>();
        r->id = peers_[p].next_recv_id++;
        r->peer = p;
        r->tag = tag;
        r->dst = static_cast<uint8_t*>(buf);
        r->bytes = bytes;
        r->chunks = 1;
        r->deadline = deadline;
        r->order = order;
        r->any = any;
        any->entries.push_back(std::move(r));
    }
    if (any->entries.empty()) {
        return PeerFailure("recv from any rank (tag " + std::to_string(tag) +
                           "): no other active member to receive from");
    }
    for (const auto& r : any->entries) {
        PeerState& ps = peers_[r->peer];
        ps.recvs.push_back(r);
        ++ps.live;
        ++live_;
    }
    wakeLocked();
    return Status::OK();
}

void P2PEngine::Impl::takeOffer(int peer, PeerState& ps, const std::shared_ptr<InRecv>& r) {
    std::shared_ptr<AnyRecv> any = r->any;
    if (any->resolved)
        return;
    any->resolved = true;
    r->any.reset();
    // Won: this reservation needs no cancel.
    --ps.cancel_reserved;
    r->reserved = false;
    r->chunks =
        r->bytes == 0 ? 1 : static_cast<uint32_t>((r->bytes - 1) / options_.chunk_bytes + 1);
    r->credited = 0;
    AnyCallback cb = std::move(any->done);
    r->done = [cb = std::move(cb), peer](Status status) { cb(std::move(status), peer); };
    for (const auto& e : any->entries) {
        if (e != r && !e->finished)
            e->cancel_due = true;
    }
    any->entries.clear();  // entries and their AnyRecv refer to each other
}

void P2PEngine::Impl::resolveAny(const std::shared_ptr<AnyRecv>& any, const Status& status) {
    if (any->resolved)
        return;
    any->resolved = true;
    if (any->done) {
        AnyCallback cb = std::move(any->done);
        any->done = nullptr;
        Callback fire = [cb = std::move(cb)](Status s) { cb(std::move(s), -1); };
        complete(fire, status);
    }
    for (const auto& e : any->entries) {
        if (!e->finished)
            e->cancel_due = true;
    }
    any->entries.clear();
}

void P2PEngine::Impl::dropReservation(const std::shared_ptr<InRecv>& r, const Status& status) {
    std::shared_ptr<AnyRecv> any = std::move(r->any);
    auto& entries = any->entries;
    entries.erase(std::remove(entries.begin(), entries.end(), r), entries.end());
    if (any->resolved)
        return;
    const bool none_left =
        std::all_of(entries.begin(), entries.end(),
                    [](const std::shared_ptr<InRecv>& e) { return e->finished; });
    if (none_left) {
        resolveAny(any, status.withContext("recv from any rank (tag " + std::to_string(any->tag) +
                                           "): no candidate sender is left"));
    }
}

Status P2PEngine::Impl::takeCancel(int peer, PeerState& ps, const p2p::Credit& c) {
    p2p::SendTag& t = ps.tags[c.slot.tag];
    // Not offered yet: answer the reservation itself.
    for (auto it = t.credits.begin(); it != t.credits.end(); ++it) {
        if (it->slot.kind == p2p::kCreditReserve && it->slot.recv_id == c.slot.recv_id) {
            const p2p::Credit reservation = *it;
            t.credits.erase(it);
            MC_RETURN_IF_ERROR(writeAck(peer, ps, reservation, p2p::kAckWithdrawn, 0, 0));
            break;
        }
    }
    // Offered: the message goes back to waiting for the next recv on the tag.
    if (t.bound && t.bound_id == c.slot.recv_id) {
        t.bound = false;
        t.offered = false;
    }
    return writeAck(peer, ps, c, p2p::kAckCancelled, 0, 0);
}

}  // namespace mooncake::pg
