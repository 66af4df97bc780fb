// Internal state of P2PEngine, shared by p2p_engine.cc (API, progress loop,
// failures), p2p_sender.cc and p2p_receiver.cc (the two halves of the
// protocol). All state below is guarded by Impl::mu_.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/core/p2p/pools.h"
#include "mooncake-pg/core/p2p/slots.h"

namespace mooncake::pg {

namespace p2p {

// A posted send, from post until delivered or failed.
struct OutMsg {
    int peer = 0;
    int tag = 0;
    size_t bytes = 0;
    uint32_t chunks = 1;           // credits the message needs (1 for 0 bytes)
    const uint8_t* src = nullptr;  // user buffer; only read before `done` fires
    Deadline deadline = Deadline::never();
    P2PEngine::Callback done;  // empty once fired
    uint32_t staged = 0;       // chunks copied into the send pool
    uint32_t sent = 0;         // chunks put to the receiver
    // Send-pool chunk of each message chunk while staged and not yet put;
    // -1 otherwise (a put chunk is owned by PeerState::unreleased).
    std::vector<int32_t> slot;
    // External pools (P2PMover): puts queued and not yet completed, and
    // chunks whose put has completed. A message dropped while puts still
    // read its buffer keeps its failure here until they complete.
    std::shared_ptr<const P2POrder> order;  // passed with each of its puts
    uint32_t in_flight = 0;
    uint32_t landed = 0;
    bool dropped = false;
    bool settled = false;  // completed and no longer counted as live
    Status failure;
};

struct InRecv;

// An any-source recv (P2PEngine::recvAny) until a sender wins it: one
// reservation entry (an InRecv with `any` set) per peer that was active when
// it was posted. The first offer read converts that peer's entry into an
// ordinary recv and cancels the others.
struct AnyRecv {
    int tag = 0;
    size_t bytes = 0;
    Deadline deadline = Deadline::never();
    P2PEngine::AnyCallback done;  // empty once handed on or fired
    bool resolved = false;        // won, timed out or failed
    std::vector<std::shared_ptr<InRecv>> entries;
};

// A posted recv, from post until completed or failed.
struct InRecv {
    uint64_t id = 0;
    int peer = 0;
    int tag = 0;
    uint8_t* dst = nullptr;
    size_t bytes = 0;
    uint32_t chunks = 1;
    Deadline deadline = Deadline::never();
    P2PEngine::Callback done;
    uint32_t credited = 0;  // credits granted
    uint32_t received = 0;  // chunks copied out
    bool finished = false;  // completed or failed; late acks only free chunks
    // Set while this is an any-source reservation entry (chunks == 1 then).
    std::shared_ptr<AnyRecv> any;
    bool reserved = false;    // the reservation credit was written
    bool cancel_due = false;  // `any` was resolved elsewhere: withdraw it
    // External pools: copies out of the pool into `dst` queued and not yet
    // completed. A recv that fails while some are queued completes (with
    // `failure`) only once they have.
    std::shared_ptr<const P2POrder> order;  // passed with each of its takes
    uint32_t in_flight = 0;
    Status failure;
};

// A credit this rank granted and has not seen acknowledged.
struct CreditRecord {
    std::shared_ptr<InRecv> recv;
    int32_t chunk = -1;  // receive-pool chunk, -1 for a 0-byte message
    uint64_t offset = 0;
    uint64_t length = 0;
};

// A credit read from the ring, waiting for its message or its staged chunk.
struct Credit {
    uint64_t seq = 0;
    CreditSlot slot{};
};

// External pools: a put of one chunk, acknowledged once it has completed.
struct QueuedPut {
    uint64_t ticket = 0;
    Credit credit;
    std::shared_ptr<OutMsg> msg;
    Deadline::Clock::time_point queued_at;
};

// External pools: a copy out of a receive-pool chunk, which is released once
// it has completed.
struct QueuedTake {
    uint64_t ticket = 0;
    std::shared_ptr<InRecv> recv;
    uint32_t chunk = 0;
    Deadline::Clock::time_point queued_at;
};

// Sender-side matching state of one (peer, tag).
struct SendTag {
    std::deque<Credit> credits;
    std::deque<std::shared_ptr<OutMsg>> msgs;  // posting order
    // The recv that msgs.front() (or, when poisoned, nothing) is bound to.
    bool bound = false;
    uint64_t bound_id = 0;
    // kAckOk: msgs.front() is bound. Otherwise the recv's remaining credits
    // are answered with this status and no data.
    uint32_t bound_status = kAckOk;
    uint64_t bound_sender_bytes = 0;
    // msgs.front() was offered to reservation bound_id and the receiver has
    // not yet picked (data credits) or withdrawn it (cancel).
    bool offered = false;
};

struct PeerState {
    // The pair epoch whose low 16 bits the pair's tokens carry. It outlives
    // resets: the next restart must pick a different token epoch.
    uint64_t epoch = 0;
    Status broken;    // non-OK: the pair is unusable until its epoch changes
    size_t live = 0;  // unfinished recvs + undelivered messages with this peer

    // This rank -> peer.
    ChunkPool send_pool;
    uint64_t credits_read = 0;
    uint64_t acks_written = 0;
    std::map<int, SendTag> tags;
    // Not fully staged, FIFO. External pools: not yet landed.
    std::deque<std::shared_ptr<OutMsg>> staging;
    // (ack index, send-pool chunk): freed once the peer has consumed the ack,
    // which proves the put that read the chunk has landed.
    std::deque<std::pair<uint64_t, uint32_t>> unreleased;
    std::deque<QueuedPut> puts;  // external pools, queue order

    // Peer -> this rank.
    ChunkPool recv_pool;
    uint64_t credits_issued = 0;
    uint64_t acks_read = 0;
    uint64_t next_recv_id = 1;
    // Ring slots kept free for the cancels that written reservations may
    // need, so a ring full of reservations can always be withdrawn:
    // credits_issued - acks_read + cancel_reserved <= ring_slots.
    uint64_t cancel_reserved = 0;
    // Granted, not yet acknowledged; keyed by credit sequence (acks come back
    // in any order across tags, so a ring index would alias a live record).
    std::unordered_map<uint64_t, CreditRecord> records;
    std::deque<std::shared_ptr<InRecv>> recvs;  // unfinished, posting order
    std::deque<QueuedTake> takes;               // external pools, queue order
};

}  // namespace p2p

class P2PEngine::Impl {
public:
    Impl(std::shared_ptr<Fabric> fabric, P2POptions options, std::shared_ptr<P2PMover> mover);
    ~Impl();

    Status send(const void* buf, size_t bytes, int peer, int tag, Deadline deadline, Callback done,
                std::shared_ptr<const P2POrder> order);
    Status recv(void* buf, size_t bytes, int peer, int tag, Deadline deadline, Callback done,
                std::shared_ptr<const P2POrder> order);
    Status recvAny(void* buf, size_t bytes, int tag, Deadline deadline, AnyCallback done,
                   std::shared_ptr<const P2POrder> order);
    Status setMembership(const std::vector<uint8_t>& active,
                         const std::vector<uint64_t>& pair_epoch);
    Status setEpoch(uint64_t epoch, const std::vector<uint8_t>* active);
    // setMembership with mu_ held and the sizes checked. The operations it
    // fails complete on the progress thread, never on the caller's.
    Status applyMembershipLocked(const std::vector<uint8_t>& active,
                                 const std::vector<uint64_t>& pair_epoch);
    P2PStats stats() const;
    Status flushSends(Deadline deadline);
    bool onProgressThread() const { return thread_.get_id() == std::this_thread::get_id(); }
    // Sends not yet delivered to peers that can still take them; mu_ held.
    size_t undeliveredSendsLocked() const;

private:
    using Clock = Deadline::Clock;

    // How long a protocol slot or cursor write (Fabric::put) may wait for
    // the peer's staging space. The progress thread serves every peer, so it
    // must not sit on one whose writes stopped completing; a peer that
    // cannot take a 64-byte slot for this long is stalled, and its pair fails
    // like on any failed put. Data puts wait until their send's deadline.
    static constexpr int64_t kControlPutTimeoutMs = 5000;
    static Deadline controlPutDeadline() { return Deadline::afterMs(kControlPutTimeoutMs); }

    // --- p2p_engine.cc: loop, deadlines, failures, completions.
    void run();
    bool pass();
    void checkDeadlines(int peer, p2p::PeerState& ps, Clock::time_point now);
    Status postCheck(int peer) const;
    // Fails every operation with `peer` with `status` and forgets the pair's
    // protocol state; `broken` keeps later posts failing until the pair
    // epoch changes.
    void failPeer(int peer, const Status& status, bool broken);
    void resetPeer(p2p::PeerState& ps);
    void complete(Callback& done, Status status);
    // Something for the progress thread (a post, completions to run,
    // stop): it skips its back-off, or wakes; mu_ held. It is cv_'s only
    // waiter.
    void wakeLocked() {
        wakes_.fetch_add(1, std::memory_order_release);
        cv_.notify_one();
    }
    // External pools: waits for every queued copy before operations whose
    // buffers they touch are failed (bounded; a mover that cannot drain is
    // logged, since there is nothing left to wait for).
    void drainMover();
    void flushCompletions(std::unique_lock<std::mutex>& lock);
    size_t chunkLength(size_t bytes, uint32_t index) const;

    // --- p2p_sender.cc: this rank -> peer.
    Status senderPass(int peer, p2p::PeerState& ps, bool* progressed);
    void releaseStaging(int peer, p2p::PeerState& ps, bool* progressed);
    Status readCredits(int peer, p2p::PeerState& ps, bool* progressed);
    Status serveCredits(int peer, p2p::PeerState& ps, bool* progressed);
    Status serveTag(int peer, p2p::PeerState& ps, int tag, p2p::SendTag& t, bool* progressed);
    void stage(int peer, p2p::PeerState& ps, bool* progressed);
    Status writeAck(int peer, p2p::PeerState& ps, const p2p::Credit& c, uint32_t status,
                    uint64_t length, uint64_t message_bytes);
    // Removes `m` (undelivered) and frees its staged chunks; fires its
    // callback with `status` if it has not fired.
    void dropMsg(p2p::PeerState& ps, std::shared_ptr<p2p::OutMsg> m, const Status& status);
    void timeoutSend(int peer, p2p::PeerState& ps, std::shared_ptr<p2p::OutMsg> m);
    // External pools: acknowledges the chunks whose puts have completed and
    // completes the sends whose data has landed.
    Status completePuts(int peer, p2p::PeerState& ps, bool* progressed);
    // Completes a send whose chunks have all landed, or a dropped one whose
    // last queued put has completed.
    void settleMsg(p2p::PeerState& ps, const std::shared_ptr<p2p::OutMsg>& m);

    // --- p2p_receiver.cc: peer -> this rank.
    Status receiverPass(int peer, p2p::PeerState& ps, bool* progressed);
    // `tell_peer`: move the peer's cursor past the acks read (not for a
    // peer that failed).
    Status readAcks(int peer, p2p::PeerState& ps, bool* progressed, bool tell_peer = true);
    Status issueCredits(int peer, p2p::PeerState& ps, bool* progressed);
    void finishRecv(p2p::PeerState& ps, std::shared_ptr<p2p::InRecv> r, Status status);
    // External pools: releases the chunks whose copies out have completed
    // and completes the recvs they finish.
    Status completeTakes(p2p::PeerState& ps, bool* progressed);
    // Writes one credit of `kind` for `r` (a data credit for its next chunk).
    Status grant(int peer, p2p::PeerState& ps, const std::shared_ptr<p2p::InRecv>& r, uint32_t kind,
                 int32_t chunk, uint64_t length);
    // p2p_any_source.cc: any-source recvs.
    // An offer from `peer` for reservation entry `r`.
    void takeOffer(int peer, p2p::PeerState& ps, const std::shared_ptr<p2p::InRecv>& r);
    // Completes `any` with `status` (no source) and withdraws its entries.
    void resolveAny(const std::shared_ptr<p2p::AnyRecv>& any, const Status& status);
    // The pair with the reservation's peer was reset: forgets `r`, and fails
    // its recv once no peer is left for it.
    void dropReservation(const std::shared_ptr<p2p::InRecv>& r, const Status& status);
    // Sender side: a cancel credit read from `peer`.
    Status takeCancel(int peer, p2p::PeerState& ps, const p2p::Credit& c);

    std::shared_ptr<Fabric> fabric_;
    const P2POptions options_;
    const std::shared_ptr<P2PMover> mover_;  // set exactly with external pools
    bool mover_stuck_ = false;               // a drain failed (drainMover)
    // A copy queued this long that has not completed while its op is past
    // its deadline means the queue has stalled: the copies are local (a copy
    // engine) and start only once their op's order is ready.
    static constexpr auto kCopyStallGrace = std::chrono::seconds(2);
    const p2p::Layout layout_;
    const int rank_;
    const int size_;
    uint8_t* const window_;
    Status init_status_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    // Counts wakeLocked() calls: the progress thread compares it across a
    // pass (something came: skip the back-off), and polls it without mu_
    // before it parks.
    std::atomic<uint64_t> wakes_{0};
    // The latest membership: a pair is usable while both ranks are active.
    std::vector<uint8_t> active_;
    std::vector<p2p::PeerState> peers_;
    size_t live_ = 0;  // sum of peers_[*].live
    std::vector<std::pair<Callback, Status>> completions_;
    P2PStats stats_;
    std::thread thread_;
};

}  // namespace mooncake::pg
