// P2PEngine's progress thread: its loop (spin, back-off, park), the pass
// over peers, deadlines, and failing a pair. The protocol halves it drives
// live in p2p_sender.cc and p2p_receiver.cc; posting and the public API in
// p2p_engine.cc.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "mooncake-pg/core/p2p/engine_impl.h"
#include "mooncake-pg/core/spin_wait.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

using p2p::PeerState;

// ---------------------------------------------------------------- failures

void P2PEngine::Impl::failPeer(int peer, const Status& status, bool broken) {
    PeerState& ps = peers_[peer];
    // Nothing may still read or write a buffer once its operation completes.
    if (mover_ && (!ps.puts.empty() || !ps.takes.empty()))
        drainMover();
    // Moved out first: dropReservation may complete an any-source recv.
    auto recvs = std::move(ps.recvs);
    ps.recvs.clear();
    for (auto& r : recvs) {
        r->finished = true;
        complete(r->done, status);
        if (r->any)
            dropReservation(r, status);
    }
    for (auto& [tag, t] : ps.tags) {
        for (auto& m : t.msgs) {
            if (!m->done && status.code() != StatusCode::kAborted) {
                MC_LOG(kWarn, "pg")
                    << "P2P: a completed send of " << m->bytes << " bytes to rank " << peer
                    << " (tag " << tag << ") was never delivered: " << status.toString();
            }
            complete(m->done, status);
        }
    }
    // External pools: sends put in full but not landed, and operations that
    // failed earlier and waited for their copies.
    for (auto& m : ps.staging)
        complete(m->done, status);
    for (auto& q : ps.puts)
        complete(q.msg->done, q.msg->dropped ? q.msg->failure : status);
    for (auto& q : ps.takes)
        complete(q.recv->done, q.recv->failure.ok() ? status : q.recv->failure);
    live_ -= ps.live;
    if (!init_status_.ok())
        return;
    resetPeer(ps);
    if (broken)
        ps.broken = status;
}

void P2PEngine::Impl::checkDeadlines(int peer, PeerState& ps, Clock::time_point now) {
    if (mover_) {
        // A copy queued long ago and still not complete at its op's
        // deadline: the queue has stalled (the device hangs). Its op would
        // wait for it forever, so the pair fails; failPeer drains with a
        // bound and logs what it could not wait for. (An op whose deadline
        // passes while its copies merely run completes after them.)
        const auto stuck = [now](Clock::time_point queued_at, const Deadline& deadline) {
            return deadline.at() <= now && now - queued_at > kCopyStallGrace;
        };
        bool stalled = false;
        for (const auto& q : ps.puts)
            stalled = stalled || stuck(q.queued_at, q.msg->deadline);
        for (const auto& q : ps.takes)
            stalled = stalled || stuck(q.queued_at, q.recv->deadline);
        if (stalled) {
            failPeer(peer,
                     Timeout("P2P copies with rank " + std::to_string(peer) +
                             " were still queued at their operation's deadline"),
                     /*broken=*/true);
            return;
        }
    }
    for (size_t i = 0; i < ps.recvs.size();) {
        auto r = ps.recvs[i];
        if (r->deadline.at() > now) {
            ++i;
            continue;
        }
        if (r->any) {
            // Withdrawn from every candidate peer by issueCredits.
            if (!r->cancel_due) {
                resolveAny(r->any, Timeout("recv of " + std::to_string(r->bytes) +
                                           " bytes from any rank (tag " + std::to_string(r->tag) +
                                           "): no sender offered a message"));
            }
            ++i;
            continue;
        }
        // Credits already granted stay outstanding; their late acks only
        // free the pool chunks.
        finishRecv(
            ps, r,
            Timeout("recv of " + std::to_string(r->bytes) + " bytes from rank " +
                    std::to_string(peer) + " (tag " + std::to_string(r->tag) + "): got " +
                    std::to_string(r->received) + " of " + std::to_string(r->chunks) + " chunks"));
    }
    for (size_t i = 0; i < ps.staging.size();) {
        auto m = ps.staging[i];
        // External pools: a send whose chunks are all queued completes as
        // soon as its copies do.
        if (m->deadline.at() > now || (mover_ && m->sent == m->chunks)) {
            ++i;
            continue;
        }
        timeoutSend(peer, ps, m);
    }
}

// ---------------------------------------------------------------- progress

bool P2PEngine::Impl::pass() {
    bool progressed = false;
    auto now = Clock::now();
    for (int p = 0; p < size_; ++p) {
        PeerState& ps = peers_[p];
        if (ps.live == 0)
            continue;
        if (fabric_->peerFailed(p)) {
            // What it delivered before it failed stands: a sender flushes
            // its last chunks and acks before it exits, and they may have
            // landed since the previous pass. With a mover, the copies out
            // of the pool they queue are waited for (bounded) and complete
            // their recvs before the pair fails.
            if (!ps.recvs.empty() && readAcks(p, ps, &progressed, /*tell_peer=*/false).ok() &&
                mover_ && !ps.takes.empty()) {
                drainMover();
                (void)completeTakes(ps, &progressed);
            }
            failPeer(p, PeerFailure("rank " + std::to_string(p) + " failed"), /*broken=*/true);
            progressed = true;
            continue;
        }
        Status st = receiverPass(p, ps, &progressed);
        if (st.ok())
            st = senderPass(p, ps, &progressed);
        if (!st.ok()) {
            // A failed put or a corrupt slot: the pair's sequences can no
            // longer be trusted, so everything with this peer fails.
            if (st.code() != StatusCode::kPeerFailure && st.code() != StatusCode::kInternal) {
                st = PeerFailure(st.message());
            }
            failPeer(p, st.withContext("P2P with rank " + std::to_string(p)), /*broken=*/true);
            progressed = true;
            continue;
        }
        checkDeadlines(p, ps, now);
    }
    return progressed;
}

void P2PEngine::Impl::run() {
    // Spin, then yield, then sleep with a doubling back-off while operations
    // are pending but nothing moves; block on cv_ when nothing is pending.
    // After a long quiet stretch the sleep cap grows so that a send parked
    // on a receiver that posts much later costs next to no CPU.
    constexpr int kSpinPasses = 500;
    constexpr int kYieldPasses = 100;
    constexpr auto kMinSleep = std::chrono::microseconds(2);
    constexpr auto kMaxSleep = std::chrono::microseconds(50);
    constexpr auto kMaxQuietSleep = std::chrono::microseconds(1000);
    constexpr auto kQuietAfter = std::chrono::milliseconds(100);

    std::unique_lock<std::mutex> lock(mu_);
    int idle = 0;
    auto sleep = kMinSleep;
    auto last_progress = Clock::now();
    while (!stop_) {
        if (!completions_.empty()) {
            flushCompletions(lock);
            continue;
        }
        if (live_ == 0 || !init_status_.ok()) {
            if (init_status_.ok()) {
                // A caller that posts ops back to back posts the next within
                // microseconds: polling for it first spares it the futex
                // round trip and the wake-up latency (core/spin_wait.h). The
                // wait below checks its condition before it blocks, so what
                // came during the poll is not missed.
                const uint64_t seen = wakes_.load(std::memory_order_acquire);
                lock.unlock();
                spinUntil([&] { return wakes_.load(std::memory_order_acquire) != seen; },
                          spinBudget());
                lock.lock();
            }
            stats_.parked = true;
            cv_.wait(lock, [this] {
                return stop_ || !completions_.empty() || (live_ > 0 && init_status_.ok());
            });
            stats_.parked = false;
            idle = 0;
            sleep = kMinSleep;
            last_progress = Clock::now();
            continue;
        }
        // Writers hold mu_, as this thread does between its reads.
        const uint64_t woken = wakes_.load(std::memory_order_relaxed);
        const auto kicked = [&] { return wakes_.load(std::memory_order_relaxed) != woken; };
        bool progressed = pass();
        ++stats_.progress_passes;
        if (!completions_.empty()) {
            progressed = true;
            flushCompletions(lock);
        }
        if (progressed || kicked()) {
            idle = 0;
            sleep = kMinSleep;
            last_progress = Clock::now();
            continue;
        }
        ++idle;
        if (idle < kSpinPasses) {
            lock.unlock();
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            lock.lock();
        } else if (idle < kSpinPasses + kYieldPasses) {
            lock.unlock();
            sched_yield();
            lock.lock();
        } else {
            fabric_->waitHint();
            cv_.wait_for(lock, sleep, [&] { return stop_ || kicked(); });
            auto cap = Clock::now() - last_progress > kQuietAfter ? kMaxQuietSleep : kMaxSleep;
            sleep = std::min<std::chrono::microseconds>(sleep * 2, cap);
        }
    }
}

}  // namespace mooncake::pg
