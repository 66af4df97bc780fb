// P2PEngine: construction, posting, membership and the public API. The
// progress thread, deadlines and failures live in p2p_progress.cc, the
// protocol halves in p2p_sender.cc and p2p_receiver.cc.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "mooncake-pg/core/p2p/engine_impl.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

using p2p::InRecv;
using p2p::OutMsg;
using p2p::PeerState;

namespace {

Status validateOptions(const P2POptions& o, int size, size_t window_bytes, bool has_mover) {
    if (o.external_pools != has_mover) {
        return InvalidArgument(o.external_pools ? "P2P options: external_pools needs a P2PMover"
                                                : "P2P options: a P2PMover needs external_pools");
    }
    if (o.chunk_bytes == 0 || o.ring_slots <= 0) {
        return InvalidArgument("P2P options: chunk_bytes and ring_slots must be positive");
    }
    if (o.pool_bytes_per_peer < o.chunk_bytes) {
        return InvalidArgument(
            "P2P options: pool_bytes_per_peer (" + std::to_string(o.pool_bytes_per_peer) +
            ") is smaller than chunk_bytes (" + std::to_string(o.chunk_bytes) + ")");
    }
    if (o.pool_bytes_per_peer / o.chunk_bytes > UINT32_MAX / 2) {
        return InvalidArgument("P2P options: too many chunks per pool");
    }
    if (o.window_offset % 8 != 0) {
        return InvalidArgument("P2P options: window_offset must be 8-byte aligned");
    }
    size_t need = o.window_offset + P2PEngine::windowBytesFor(size, o);
    if (need > window_bytes) {
        return InvalidArgument("P2P area needs " + std::to_string(need) +
                               " window bytes, the fabric has " + std::to_string(window_bytes));
    }
    return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------- Impl basics

P2PEngine::Impl::Impl(std::shared_ptr<Fabric> fabric, P2POptions options,
                      std::shared_ptr<P2PMover> mover)
    : fabric_(std::move(fabric)),
      options_(options),
      mover_(std::move(mover)),
      layout_(fabric_->size(), options_),
      rank_(fabric_->rank()),
      size_(fabric_->size()),
      window_(fabric_->localWindow()),
      init_status_(validateOptions(options_, size_, fabric_->windowBytes(), mover_ != nullptr)),
      active_(static_cast<size_t>(size_), 1),
      peers_(static_cast<size_t>(size_)) {
    if (init_status_.ok()) {
        for (auto& ps : peers_)
            resetPeer(ps);
    }
    thread_ = std::thread([this] { run(); });
}

P2PEngine::Impl::~Impl() {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    wakeLocked();
    lock.unlock();
    thread_.join();
    lock.lock();
    for (int p = 0; p < size_; ++p) {
        failPeer(p, Aborted("P2P engine destroyed"), /*broken=*/true);
    }
    flushCompletions(lock);
}

void P2PEngine::Impl::resetPeer(PeerState& ps) {
    ps.broken = Status::OK();
    ps.live = 0;
    ps.send_pool = p2p::ChunkPool(options_.pool_bytes_per_peer, options_.chunk_bytes);
    ps.credits_read = 0;
    ps.acks_written = 0;
    ps.tags.clear();
    ps.staging.clear();
    ps.unreleased.clear();
    ps.recv_pool = p2p::ChunkPool(options_.pool_bytes_per_peer, options_.chunk_bytes);
    ps.credits_issued = 0;
    ps.acks_read = 0;
    ps.next_recv_id = 1;
    ps.cancel_reserved = 0;
    ps.records.clear();
    ps.recvs.clear();
    ps.puts.clear();
    ps.takes.clear();
}

size_t P2PEngine::Impl::chunkLength(size_t bytes, uint32_t index) const {
    size_t offset = size_t{index} * options_.chunk_bytes;
    return offset >= bytes ? 0 : std::min(options_.chunk_bytes, bytes - offset);
}

void P2PEngine::Impl::complete(Callback& done, Status status) {
    if (!done)
        return;
    completions_.emplace_back(std::move(done), std::move(status));
    done = nullptr;
}

void P2PEngine::Impl::drainMover() {
    // Queued copies are local copies (a copy engine), done in microseconds
    // to milliseconds; this bound only guards against a broken device.
    constexpr int64_t kDrainTimeoutMs = 5000;
    // Once a drain has failed, later ones only look (teardown fails every
    // pair: waiting out the bound again for each would add up).
    const Status st = mover_->drain(Deadline::afterMs(mover_stuck_ ? 0 : kDrainTimeoutMs));
    if (!st.ok()) {
        mover_stuck_ = true;
        MC_LOG(kError, "pg") << "P2P: queued copies did not complete before their operations "
                                "were failed: "
                             << st.toString();
    }
}

void P2PEngine::Impl::flushCompletions(std::unique_lock<std::mutex>& lock) {
    if (completions_.empty())
        return;
    auto batch = std::move(completions_);
    completions_.clear();
    // Callbacks run unlocked: they may post the next operation.
    lock.unlock();
    for (auto& [done, status] : batch)
        done(std::move(status));
    lock.lock();
}

P2PStats P2PEngine::Impl::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

// ---------------------------------------------------------------- posting

Status P2PEngine::Impl::postCheck(int peer) const {
    if (!init_status_.ok())
        return init_status_;
    if (peer < 0 || peer >= size_) {
        return InvalidArgument("peer " + std::to_string(peer) + " outside [0, " +
                               std::to_string(size_) + ")");
    }
    if (peer == rank_)
        return InvalidArgument("P2P with self (rank " + std::to_string(peer) + ")");
    if (stop_)
        return Aborted("P2P engine is shutting down");
    if (!active_[rank_]) {
        return Unavailable("this rank (" + std::to_string(rank_) +
                           ") is not an active member; P2P starts once it is activated");
    }
    if (!active_[peer])
        return PeerFailure("rank " + std::to_string(peer) + " is not an active member");
    if (!peers_[peer].broken.ok())
        return peers_[peer].broken;
    if (fabric_->peerFailed(peer))
        return PeerFailure("rank " + std::to_string(peer) + " failed");
    return Status::OK();
}

Status P2PEngine::Impl::send(const void* buf, size_t bytes, int peer, int tag, Deadline deadline,
                             Callback done, std::shared_ptr<const P2POrder> order) {
    if (buf == nullptr && bytes > 0)
        return InvalidArgument("send: null buffer");
    if (!init_status_.ok())
        return init_status_;
    if (bytes > 0 && (bytes - 1) / options_.chunk_bytes >= UINT32_MAX) {
        return InvalidArgument("send of " + std::to_string(bytes) + " bytes: too many chunks");
    }
    auto m = std::make_shared<OutMsg>();
    m->peer = peer;
    m->tag = tag;
    m->bytes = bytes;
    m->chunks = bytes == 0 ? 1 : static_cast<uint32_t>((bytes - 1) / options_.chunk_bytes + 1);
    m->src = static_cast<const uint8_t*>(buf);
    m->deadline = deadline;
    m->done = std::move(done);
    m->order = std::move(order);
    m->slot.assign(m->chunks, -1);

    std::lock_guard<std::mutex> lock(mu_);
    MC_RETURN_IF_ERROR(postCheck(peer).withContext("send to rank " + std::to_string(peer)));
    PeerState& ps = peers_[peer];
    ps.tags[tag].msgs.push_back(m);
    ps.staging.push_back(std::move(m));
    ++ps.live;
    ++live_;
    wakeLocked();
    return Status::OK();
}

Status P2PEngine::Impl::recv(void* buf, size_t bytes, int peer, int tag, Deadline deadline,
                             Callback done, std::shared_ptr<const P2POrder> order) {
    if (buf == nullptr && bytes > 0)
        return InvalidArgument("recv: null buffer");
    if (!init_status_.ok())
        return init_status_;
    if (bytes > 0 && (bytes - 1) / options_.chunk_bytes >= UINT32_MAX) {
        return InvalidArgument("recv of " + std::to_string(bytes) + " bytes: too many chunks");
    }
    auto r = std::make_shared<InRecv>();
    r->peer = peer;
    r->tag = tag;
    r->dst = static_cast<uint8_t*>(buf);
    r->bytes = bytes;
    r->chunks = bytes == 0 ? 1 : static_cast<uint32_t>((bytes - 1) / options_.chunk_bytes + 1);
    r->deadline = deadline;
    r->done = std::move(done);
    r->order = std::move(order);

    std::lock_guard<std::mutex> lock(mu_);
    MC_RETURN_IF_ERROR(postCheck(peer).withContext("recv from rank " + std::to_string(peer)));
    PeerState& ps = peers_[peer];
    r->id = ps.next_recv_id++;
    ps.recvs.push_back(std::move(r));
    ++ps.live;
    ++live_;
    wakeLocked();
    return Status::OK();
}

Status P2PEngine::Impl::setMembership(const std::vector<uint8_t>& active,
                                      const std::vector<uint64_t>& pair_epoch) {
    const auto n = static_cast<size_t>(size_);
    if (active.size() != n || pair_epoch.size() != n) {
        return InvalidArgument("setMembership: active has " + std::to_string(active.size()) +
                               " entries and pair_epoch " + std::to_string(pair_epoch.size()) +
                               ", expected one per rank (" + std::to_string(n) + ")");
    }
    std::unique_lock<std::mutex> lock(mu_);
    return applyMembershipLocked(active, pair_epoch);
}

Status P2PEngine::Impl::applyMembershipLocked(const std::vector<uint8_t>& active,
                                              const std::vector<uint64_t>& pair_epoch) {
    const bool self_now = active[rank_] != 0;
    // Checked before anything changes: a pair restarted in an epoch equal to
    // its previous one modulo 2^16 (the token's epoch bits) could take the
    // previous epoch's slots for new ones.
    for (int p = 0; p < size_; ++p) {
        const uint64_t was = peers_[p].epoch;
        if (p == rank_ || !self_now || !active[p] || pair_epoch[p] == was)
            continue;
        if ((pair_epoch[p] & 0xffff) == (was & 0xffff)) {
            return InvalidArgument("setMembership: pair epoch of rank " + std::to_string(p) +
                                   " goes from " + std::to_string(was) + " to " +
                                   std::to_string(pair_epoch[p]) + ", equal modulo 65536");
        }
    }
    const bool self_was = active_[rank_] != 0;
    for (int p = 0; p < size_; ++p) {
        if (p == rank_)
            continue;
        PeerState& ps = peers_[p];
        const bool was = self_was && active_[p];
        if (!self_now || !active[p]) {
            if (was) {
                failPeer(p,
                         self_now ? PeerFailure("rank " + std::to_string(p) +
                                                " is no longer an active member")
                                  : Aborted("this rank (" + std::to_string(rank_) +
                                            ") is no longer an active member"),
                         /*broken=*/false);
            }
            continue;
        }
        if (pair_epoch[p] != ps.epoch) {
            // Sequences restart; slots left from the old pair epoch carry its
            // token and are never accepted again. The other rank of the pair
            // computes the same pair epoch from the same view, so it restarts
            // too, whichever views in between either of them skipped.
            failPeer(p,
                     Aborted("P2P pair epoch with rank " + std::to_string(p) + " changed from " +
                             std::to_string(ps.epoch) + " to " + std::to_string(pair_epoch[p])),
                     /*broken=*/false);
            ps.epoch = pair_epoch[p];
        } else if (!was) {
            // Back in the same pair epoch: the sequences cannot restart safely
            // (see above), so the pair stays unusable until its epoch changes.
            failPeer(
                p,
                Aborted("P2P with rank " + std::to_string(p) + " resumed in the same pair epoch " +
                        std::to_string(ps.epoch) + "; it needs a new one"),
                /*broken=*/true);
        }
    }
    active_ = active;
    // The progress thread runs these, not the caller: a completion may drop
    // the last reference to the caller's owner, whose membership change is
    // still under way on this stack.
    if (!completions_.empty())
        wakeLocked();
    return Status::OK();
}

Status P2PEngine::Impl::setEpoch(uint64_t epoch, const std::vector<uint8_t>* active) {
    if (active != nullptr && active->size() != static_cast<size_t>(size_)) {
        return InvalidArgument("setEpoch: active mask has " + std::to_string(active->size()) +
                               " entries for " + std::to_string(size_) + " ranks");
    }
    std::unique_lock<std::mutex> lock(mu_);
    const std::vector<uint8_t> mask = active != nullptr ? *active : active_;
    return applyMembershipLocked(mask, std::vector<uint64_t>(static_cast<size_t>(size_), epoch));
}

// ---------------------------------------------------------------- P2PEngine

size_t P2PEngine::windowBytesFor(int size, const P2POptions& options) {
    return p2p::Layout(size, options).bytes();
}

P2PEngine::P2PEngine(std::shared_ptr<Fabric> fabric, P2POptions options)
    : impl_(std::make_unique<Impl>(std::move(fabric), options, nullptr)) {}

P2PEngine::P2PEngine(std::shared_ptr<Fabric> fabric, P2POptions options,
                     std::shared_ptr<P2PMover> mover)
    : impl_(std::make_unique<Impl>(std::move(fabric), options, std::move(mover))) {}

P2PEngine::~P2PEngine() {
    if (impl_ && impl_->onProgressThread()) {
        // Joining would be this thread joining itself; the Impl stays alive
        // (its thread returns into it) until a thread of its own destroys it.
        std::thread([impl = std::move(impl_)]() mutable { impl.reset(); }).detach();
    }
}

bool P2PEngine::onProgressThread() const {
    return impl_->onProgressThread();
}

Status P2PEngine::send(const void* buf, size_t bytes, int peer, int tag, Deadline deadline,
                       Callback done, std::shared_ptr<const P2POrder> order) {
    return impl_->send(buf, bytes, peer, tag, deadline, std::move(done), std::move(order));
}

Status P2PEngine::recv(void* buf, size_t bytes, int peer, int tag, Deadline deadline, Callback done,
                       std::shared_ptr<const P2POrder> order) {
    return impl_->recv(buf, bytes, peer, tag, deadline, std::move(done), std::move(order));
}

Status P2PEngine::recvAny(void* buf, size_t bytes, int tag, Deadline deadline, AnyCallback done,
                          std::shared_ptr<const P2POrder> order) {
    return impl_->recvAny(buf, bytes, tag, deadline, std::move(done), std::move(order));
}

Status P2PEngine::setMembership(const std::vector<uint8_t>& active,
                                const std::vector<uint64_t>& pair_epoch) {
    return impl_->setMembership(active, pair_epoch);
}

Status P2PEngine::setEpoch(uint64_t epoch) {
    return impl_->setEpoch(epoch, nullptr);
}

Status P2PEngine::setEpoch(uint64_t epoch, const std::vector<uint8_t>& active) {
    return impl_->setEpoch(epoch, &active);
}

P2PStats P2PEngine::stats() const {
    return impl_->stats();
}

Status P2PEngine::flushSends(Deadline deadline) {
    return impl_->flushSends(deadline);
}

size_t P2PEngine::Impl::undeliveredSendsLocked() const {
    size_t n = 0;
    for (int p = 0; p < size_; ++p) {
        const p2p::PeerState& ps = peers_[p];
        if (p == rank_ || !active_[p] || !ps.broken.ok() || fabric_->peerFailed(p))
            continue;
        // Every posted send stays in its tag's queue until delivered; with
        // external pools, in `staging` until its data has landed.
        if (mover_) {
            n += ps.staging.size();
            continue;
        }
        for (const auto& [tag, t] : ps.tags)
            n += t.msgs.size();
    }
    return n;
}

Status P2PEngine::Impl::flushSends(Deadline deadline) {
    // The progress thread delivers; completions do not signal a condition
    // this can wait on, so poll at a fraction of a typical delivery.
    constexpr auto kPoll = std::chrono::milliseconds(2);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        const size_t left = undeliveredSendsLocked();
        if (left == 0 || stop_)
            return Status::OK();
        if (deadline.expired()) {
            return Timeout(std::to_string(left) +
                           " send(s) not yet taken by their receivers (no matching recv posted?)");
        }
        lock.unlock();
        std::this_thread::sleep_for(kPoll);
        lock.lock();
    }
}

}  // namespace mooncake::pg
