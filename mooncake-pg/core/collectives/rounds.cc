#include "mooncake-pg/core/collectives/rounds.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "mooncake-pg/core/collectives/call_check.h"
#include "mooncake-pg/core/reduce_pool.h"

namespace mooncake::pg::coll {
namespace {

// Messages at most this large are staged with their header and written by
// one put: on a remote fabric that is one transfer instead of two or three.
constexpr size_t kInlinePayload = 384;

// waitFlag spins for a long time before it yields. With more ranks than
// cores (common for CPU collectives) a spinning waiter holds the core that
// the rank it waits for needs, so after a short spin the predicate yields on
// every poll: nearly free when the core has nothing else to run, and it cuts
// small-message latency with 4 ranks on 2 cores by an order of magnitude.
constexpr uint32_t kSpinPollsBeforeYield = 16;

uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7FB5D329728EA185ull;
    x ^= x >> 27;
    x *= 0x81DADEF4BC2DD44Dull;
    x ^= x >> 33;
    return x;
}

// One term of the all-to-all-v digest: a pseudo-random function of the
// (sender, receiver, bytes) triple.
uint64_t pairTerm(int sender, int receiver, uint64_t bytes) {
    const uint64_t pair = (static_cast<uint64_t>(sender) << 32) | static_cast<uint32_t>(receiver);
    return mix64(mix64(pair + 0x9E3779B97F4A7C15ull) + bytes);
}

uint32_t clampTo32(size_t v) {
    return static_cast<uint32_t>(std::min<size_t>(v, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

size_t slotPayloadBytes(const CommOptions& options) {
    const size_t want = std::max(options.chunk_bytes, kLineBytes);
    return (want + kLineBytes - 1) / kLineBytes * kLineBytes;
}

const char* opKindName(OpKind kind) {
    switch (kind) {
        case OpKind::kAllReduce:
            return "all_reduce";
        case OpKind::kBroadcast:
            return "broadcast";
        case OpKind::kReduce:
            return "reduce";
        case OpKind::kAllGather:
            return "all_gather";
        case OpKind::kReduceScatter:
            return "reduce_scatter";
        case OpKind::kAllToAllV:
            return "all_to_all_v";
        case OpKind::kGather:
            return "gather";
        case OpKind::kScatter:
            return "scatter";
        case OpKind::kBarrier:
            return "barrier";
    }
    return "unknown_collective";
}

Rounds::Rounds(CommState& state, const CallDesc& call, Deadline deadline)
    : state_(state),
      call_(call),
      deadline_(deadline),
      seq_(state.seq),
      first_round_(state.round),
      sent_(state.scratch.sent),
      payload_(state.scratch.payload),
      payload_bytes_(state.scratch.payload_bytes),
      published_(state.scratch.published),
      published_bytes_(state.scratch.published_bytes),
      headers_(state.scratch.headers),
      inputs_(state.scratch.inputs) {
    const size_t n = static_cast<size_t>(state.size);
    sent_.assign(n, 0);
    payload_.assign(n, nullptr);
    payload_bytes_.assign(n, 0);
    published_.assign(n, nullptr);
    published_bytes_.assign(n, 0);
    headers_.assign(n, MsgHeader{});
    inputs_.assign(state.members.size(), nullptr);
    // The header of this rank's own call is the reference the checks compare
    // every received header with.
    headers_[state_.rank] = headerFor(state_.rank, 0, 0);
    ++state_.seq;
}

Rounds::~Rounds() = default;

MsgHeader Rounds::headerFor(int peer, size_t payload_bytes, size_t published) const {
    MsgHeader h{};
    h.token = makeToken(state_.epoch, state_.round);
    h.payload_bytes = static_cast<uint32_t>(payload_bytes);
    h.published_bytes = static_cast<uint32_t>(published);
    if (call_round_ != 0)
        return h;
    h.seq = seq_;
    Fabric& fabric = *state_.fabric;
    bool every = true;
    for (int m : state_.members) {
        if (m != state_.rank && fabric.peerWindow(m) == nullptr)
            every = false;
    }
    if (every)
        h.flags |= kReadsEveryWindow;
    if (peer != state_.rank && fabric.peerWindow(peer) != nullptr)
        h.flags |= kReadsYourWindow;
    h.kind = static_cast<uint8_t>(call_.kind);
    h.dtype = static_cast<uint8_t>(call_.dtype);
    h.op = static_cast<uint8_t>(call_.op);
    h.root = call_.root;
    h.chunk_bytes = clampTo32(state_.layout.chunk);
    h.one_shot_max = clampTo32(state_.one_shot_max);
    h.count = call_.count;
    h.signature = call_.signature;
    if (call_.failed_locally) {
        h.flags |= kFailedLocally;
        h.failed_code = static_cast<uint32_t>(local_failure_.code());
        return h;
    }
    if (call_.kind == OpKind::kAllToAllV) {
        const auto& send = *call_.send_bytes;
        const auto& recv = *call_.recv_bytes;
        h.count = recv[peer];
        h.pair_bytes = send[peer];
        // Over all ranks the terms cancel exactly when every receiver expects
        // what its sender sends; each rank only knows its own row, so the
        // sum is how all of them learn about a mismatch between two others.
        for (int m : state_.members) {
            if (m == state_.rank)
                continue;
            h.max_bytes = std::max<uint64_t>(h.max_bytes, send[m]);
            h.digest += pairTerm(state_.rank, m, send[m]);
            h.digest -= pairTerm(m, state_.rank, recv[m]);
        }
    }
    return h;
}

void Rounds::blame(int peer) {
    auto& failed = state_.failure.failed_ranks;
    if (peer >= 0 && std::find(failed.begin(), failed.end(), peer) == failed.end()) {
        failed.push_back(peer);
    }
}

Status Rounds::failQuietly(int peer, const Status& status) {
    blame(peer);
    Status out = status.withContext(std::string(opKindName(call_.kind)) + " round " +
                                    std::to_string(call_round_));
    state_.broken = out.toString();
    return out;
}

Status Rounds::fail(int peer, const Status& status) {
    Status out = failQuietly(peer, status);
    const auto& failed = state_.failure.failed_ranks;
    const uint64_t notice = encodeAbortNotice(state_.epoch, static_cast<uint8_t>(status.code()),
                                              failed.empty() ? -1 : failed.front());
    for (int m : state_.members) {
        // Best effort: a member that cannot be reached is dead or will meet
        // this rank's silence at its own deadline.
        if (m != state_.rank)
            (void)state_.fabric->putFlag(m, state_.layout.abortFlag(state_.rank), notice,
                                         deadline_);
    }
    return out;
}

int Rounds::noticeFrom(int awaited) const {
    const uint8_t* window = state_.fabric->localWindow();
    for (int m : state_.members) {
        if (m == state_.rank)
            continue;
        const uint64_t v = loadFlag(window, state_.layout.abortFlag(m));
        if (!abortNoticeApplies(v, state_.epoch))
            continue;
        // "Removed" says only that m moved on: everything it sent before is
        // still there, so it ends the wait only when m is the one awaited
        // (a call the others completed must complete here too).
        if (decodeAbortNotice(v).reason == kRemovedReason && m != awaited)
            continue;
        return m;
    }
    return -1;
}

Status Rounds::checkAbortNotices(int awaited) {
    const int m = noticeFrom(awaited);
    if (m < 0)
        return Status::OK();
    const AbortNotice n =
        decodeAbortNotice(loadFlag(state_.fabric->localWindow(), state_.layout.abortFlag(m)));
    if (n.reason == kRemovedReason) {
        return failQuietly(
            -1, Aborted("rank " + std::to_string(state_.rank) + " was deactivated in epoch " +
                        std::to_string(n.epoch) + " (told by rank " + std::to_string(m) + ")"));
    }
    const auto code = static_cast<StatusCode>(n.reason);
    const std::string culprit =
        n.culprit >= 0 ? "rank " + std::to_string(n.culprit) : std::string("an unknown rank");
    return failQuietly(n.culprit, Status(code, "rank " + std::to_string(m) +
                                                   " failed the call because of " + culprit));
}

Status Rounds::failWait(int peer, const Status& status) {
    // Every round is full mesh, so when one member stops, every other one
    // ends up waiting on *some* member, often one that is itself blocked
    // behind the culprit. Blaming the awaited peer would name healthy ranks
    // and get them deactivated, so the blame comes from evidence about all
    // members of the call.
    Fabric& fabric = *state_.fabric;
    std::string names;
    for (int m : state_.members) {
        if (m != state_.rank && fabric.peerFailed(m)) {
            blame(m);
            names += (names.empty() ? "" : ", ") + std::to_string(m);
        }
    }
    if (!names.empty())
        return fail(-1, PeerFailure("rank(s) " + names + " failed (" + status.toString() + ")"));
    if (status.code() == StatusCode::kTimeout) {
        // No member is known dead. Every member that entered this call sent
        // its round-0 message to every other member before waiting on
        // anyone, so a missing one names a rank that is alive but never
        // joined the call; the ranks blocked behind it all did send theirs.
        const uint8_t* window = fabric.localWindow();
        const uint64_t first = makeToken(state_.epoch, first_round_);
        for (int m : state_.members) {
            if (m != state_.rank &&
                !tokenAtLeast(loadFlag(window, state_.layout.dataFlag(m)), first)) {
                blame(m);
                names += (names.empty() ? "" : ", ") + std::to_string(m);
            }
        }
        if (!names.empty()) {
            return fail(-1, Timeout("rank(s) " + names + " never entered the call (" +
                                    status.toString() + ")"));
        }
    }
    // Every member is alive as far as this rank can tell and entered the
    // call: the awaited peer is the best remaining guess.
    return fail(peer, status);
}

bool Rounds::arrivedSince(uint64_t offset, uint64_t want, uint64_t* value) const {
    // `v` in waitAtLeast's predicate was read before the ack or the notice
    // that ends the wait. A peer that finished the call wrote what this rank
    // awaits before it moved on or sent the notice, so a fresh read after
    // seeing either shows it: the call the peer completed completes here too.
    const uint64_t now = loadFlag(state_.fabric->localWindow(), offset);
    if (!tokenAtLeast(now, want))
        return false;
    *value = now;
    return true;
}

Status Rounds::waitAtLeast(int peer, uint64_t offset, uint64_t want, uint64_t* seen) {
    Fabric& fabric = *state_.fabric;
    uint64_t value = 0;
    uint32_t polls = 0;
    const uint8_t* window = fabric.localWindow();
    const uint64_t newer = epochFloor(state_.epoch + 1);
    bool moved_on = false;
    bool noticed = false;
    auto ready = [&](uint64_t v) {
        value = v;
        if (tokenAtLeast(v, want))
            return true;
        // A peer that applied a newer view acknowledges the new epoch's floor
        // and then waits for ours before it sends anything; without looking
        // at its ack flag both sides would wait for each other until the
        // deadline.
        if (tokenAtLeast(loadFlag(window, state_.layout.ackFlag(peer)), newer)) {
            moved_on = !arrivedSince(offset, want, &value);
            return true;
        }
        if (polls >= kSpinPollsBeforeYield)
            sched_yield();
        // The awaited peer may be alive but itself stuck on a dead rank; it
        // says so with an abort notice. Only notices, not the liveness of
        // members nobody waits on, end the wait early (rounds.h).
        if ((++polls & 15) == 0 && noticeFrom(peer) >= 0) {
            noticed = !arrivedSince(offset, want, &value);
            return true;
        }
        return false;
    };
    Status st = waitFlag(fabric, offset, ready, deadline_, peer);
    if (!st.ok())
        return failWait(peer, st);
    if (noticed)
        return checkAbortNotices(peer);
    if (moved_on || tokenAtLeast(value, newer)) {
        // Not broadcast: the others learn of the newer epoch from the
        // members that applied it, and retry the call in it.
        return failQuietly(
            -1, EpochChanged("rank " + std::to_string(peer) + " moved on to a newer epoch"));
    }
    *seen = value;
    return Status::OK();
}

Status Rounds::send(int peer, const void* a, size_t a_len, const void* b, size_t b_len,
                    size_t published) {
    const size_t total = a_len + b_len;
    const size_t chunk = state_.layout.chunk;
    if (peer == state_.rank || total > chunk || published > chunk || sent_[peer] ||
        (published != 0 && !readsInPlace(peer))) {
        return fail(-1,
                    Internal("bad send to rank " + std::to_string(peer) + " of " +
                             std::to_string(total) + "+" + std::to_string(published) + " bytes"));
    }
    const uint64_t round = state_.round;
    const int k = static_cast<int>(round & 1);
    // The slot held our message of round - 2 (or, at the start of an epoch,
    // one from an older epoch that the peer released in setMembership).
    uint64_t need = 0;
    if (round >= kFirstRound + 2) {
        need = makeToken(state_.epoch, round - 2);
    } else if (state_.view_epoch > 0) {
        need = epochFloor(state_.epoch);
    }
    if (need != 0) {
        uint64_t seen = 0;
        MC_RETURN_IF_ERROR(waitAtLeast(peer, state_.layout.ackFlag(peer), need, &seen));
    }

    const MsgHeader h = headerFor(peer, total, published);
    const uint64_t off = state_.layout.slot(state_.rank, k);
    Fabric& fabric = *state_.fabric;
    Status st;
    if (total <= kInlinePayload) {
        alignas(kLineBytes) uint8_t staged[kHeaderBytes + kInlinePayload];
        std::memcpy(staged, &h, sizeof(h));
        if (a_len != 0)
            std::memcpy(staged + kHeaderBytes, a, a_len);
        if (b_len != 0)
            std::memcpy(staged + kHeaderBytes + a_len, b, b_len);
        st = fabric.put(peer, off, staged, kHeaderBytes + total, deadline_);
    } else {
        st = fabric.put(peer, off, &h, sizeof(h), deadline_);
        if (st.ok() && a_len != 0)
            st = fabric.put(peer, off + kHeaderBytes, a, a_len, deadline_);
        if (st.ok() && b_len != 0)
            st = fabric.put(peer, off + kHeaderBytes + a_len, b, b_len, deadline_);
    }
    if (st.ok())
        st = fabric.putFlag(peer, state_.layout.dataFlag(state_.rank), h.token, deadline_);
    if (!st.ok())
        return failWait(peer, st);
    sent_[peer] = 1;
    return Status::OK();
}

Status Rounds::sendToAll(const void* data, size_t len, int skip) {
    if (len == 0)
        return Status::OK();  // receiveAll sends the header-only messages
    bool staged = false;
    for (int p : state_.members) {
        if (p == state_.rank || p == skip)
            continue;
        if (!readsInPlace(p)) {
            MC_RETURN_IF_ERROR(send(p, data, len));
            continue;
        }
        if (!staged) {
            // Once for all the peers that read it in place.
            std::memcpy(publishArea(), data, len);
            staged = true;
        }
        MC_RETURN_IF_ERROR(send(p, nullptr, 0, nullptr, 0, len));
    }
    return Status::OK();
}

Status Rounds::receiveAll() {
    for (int m : state_.members) {
        if (m != state_.rank && !sent_[m])
            MC_RETURN_IF_ERROR(send(m, nullptr, 0));
    }
    const uint64_t token = makeToken(state_.epoch, state_.round);
    const int k = static_cast<int>(state_.round & 1);
    const uint8_t* window = state_.fabric->localWindow();
    for (int m : state_.members) {
        if (m == state_.rank)
            continue;
        uint64_t seen = 0;
        MC_RETURN_IF_ERROR(waitAtLeast(m, state_.layout.dataFlag(m), token, &seen));
        // The flag may already announce the peer's next round; the slot
        // still holds this one because it waits for our ack to reuse it.
        const uint8_t* slot = window + state_.layout.slot(m, k);
        MsgHeader h;
        std::memcpy(&h, slot, sizeof(h));
        const uint8_t* peer_window =
            h.published_bytes != 0 ? state_.fabric->peerWindow(m) : nullptr;
        if (h.published_bytes != 0 && peer_window == nullptr && state_.fabric->peerFailed(m))
            return failWait(m, PeerFailure("rank " + std::to_string(m) + " failed"));
        if (h.token != token || h.payload_bytes > state_.layout.chunk ||
            h.published_bytes > state_.layout.chunk ||
            (h.published_bytes != 0 && peer_window == nullptr)) {
            return fail(
                m, Internal("message from rank " + std::to_string(m) + " carries token " +
                            std::to_string(h.token) + " and " + std::to_string(h.payload_bytes) +
                            "+" + std::to_string(h.published_bytes) + " bytes, expected token " +
                            std::to_string(token)));
        }
        payload_[m] = slot + kHeaderBytes;
        payload_bytes_[m] = h.payload_bytes;
        published_bytes_[m] = h.published_bytes;
        published_[m] = peer_window != nullptr
                            ? peer_window + state_.layout.slot(m, k) + kHeaderBytes
                            : nullptr;
        if (call_round_ == 0)
            headers_[m] = h;
    }
    if (call_round_ != 0)
        return Status::OK();

    learnFromHeaders();
    Status st = checkLocalFailures();
    if (st.ok())
        st = checkCallHeaders(state_, call_, headers_);
    if (!st.ok()) {
        // Everyone found the same mismatch; finishing the round keeps the
        // ranks in step for the next call.
        MC_RETURN_IF_ERROR(finishRound());
        return st;
    }
    return Status::OK();
}

void Rounds::learnFromHeaders() {
    everyone_in_place_ = true;
    for (int m : state_.members) {
        const MsgHeader& h = headers_[m];
        max_announced_ = std::max(max_announced_, h.max_bytes);
        if ((h.flags & kReadsEveryWindow) == 0)
            everyone_in_place_ = false;
        if (m != state_.rank)
            state_.read_in_place[m] = (h.flags & kReadsYourWindow) != 0 ? 1 : 0;
    }
}

Status Rounds::checkLocalFailures() const {
    for (int m : state_.members) {
        const MsgHeader& h = headers_[m];
        if ((h.flags & kFailedLocally) == 0)
            continue;
        // Every member holds the same text, so the error reads the same on
        // every rank whichever of them is asked.
        const std::string text =
            m == state_.rank
                ? local_failure_.message()
                : std::string(reinterpret_cast<const char*>(payload_[m]), payload_bytes_[m]);
        return Status(static_cast<StatusCode>(h.failed_code),
                      text + " (rank " + std::to_string(m) +
                          " failed the call before the exchange; it fails on every rank)");
    }
    return Status::OK();
}

Status Rounds::failTogether(const Status& local) {
    local_failure_ = local;
    if (!call_.failed_locally || call_round_ != 0 || local.ok()) {
        return fail(-1, Internal("failTogether needs a locally failed call before round 0"));
    }
    headers_[state_.rank] = headerFor(state_.rank, 0, 0);
    // The text the peers print; the slot bounds it (chunk >= 64 bytes).
    const std::string& text = local.message();
    const size_t len = std::min(text.size(), state_.layout.chunk);
    for (int m : state_.members) {
        if (m != state_.rank)
            MC_RETURN_IF_ERROR(send(m, text.data(), len));
    }
    Status st = receiveAll();
    if (st.ok()) {
        // Unreachable: this rank's own header carries kFailedLocally.
        return fail(-1, Internal("a locally failed call passed the round-0 check"));
    }
    return st;
}

Status Rounds::expectBytes(int peer, size_t payload, size_t published) {
    if (payload_bytes_[peer] == payload && published_bytes_[peer] == published)
        return Status::OK();
    return fail(peer, Internal("rank " + std::to_string(peer) + " sent " +
                               std::to_string(payload_bytes_[peer]) + "+" +
                               std::to_string(published_bytes_[peer]) + " bytes, expected " +
                               std::to_string(payload) + "+" + std::to_string(published)));
}

Status Rounds::expectData(int peer, size_t bytes) {
    if (published_bytes_[peer] != 0)
        return expectBytes(peer, 0, bytes);
    return expectBytes(peer, bytes, 0);
}

Status Rounds::checkPublishedIntact() {
    bool read_any = false;
    for (int m : state_.members)
        read_any = read_any || (m != state_.rank && published_bytes_[m] != 0);
    if (!read_any)
        return Status::OK();
    // The copies before the stamps: a copy that saw any byte written after
    // a restamp then sees the new stamp (the writer's fence in stampedSlot).
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t token = makeToken(state_.epoch, state_.round);
    for (int m : state_.members) {
        if (m == state_.rank || published_bytes_[m] == 0 || published_[m] == nullptr)
            continue;
        const auto* stamp = reinterpret_cast<const uint64_t*>(published_[m] - kHeaderBytes);
        const uint64_t now =
            std::atomic_ref<const uint64_t>(*stamp).load(std::memory_order_relaxed);
        if (now == token)
            continue;
        return failQuietly(
            -1, Aborted("rank " + std::to_string(m) + " reused the slot it published round " +
                        std::to_string(call_round_) + "'s data in before rank " +
                        std::to_string(state_.rank) +
                        " had read it: it moved on to a newer membership epoch without this rank"));
    }
    return Status::OK();
}

Status Rounds::finishRound() {
    // Before the acks: the call must not complete on data that changed
    // under the copy.
    MC_RETURN_IF_ERROR(checkPublishedIntact());
    const uint64_t token = makeToken(state_.epoch, state_.round);
    Fabric& fabric = *state_.fabric;
    for (int m : state_.members) {
        if (m == state_.rank)
            continue;
        // A member that cannot take the ack is gone; it needs nothing more
        // from this call, and the others must not fail a call they finished
        // because it left right after finishing too (rounds.h). If it is
        // still alive it meets the missing ack in its next call.
        (void)fabric.putFlag(m, state_.layout.ackFlag(state_.rank), token, deadline_);
    }
    ++state_.round;
    ++call_round_;
    std::fill(sent_.begin(), sent_.end(), 0);
    return Status::OK();
}

int Rounds::stepThreads() const {
    int local = 1;
    for (int m : state_.members) {
        if (m != state_.rank && state_.fabric->peerWindow(m) != nullptr)
            ++local;
    }
    return reduceThreadsFor(state_.reduce_threads, local);
}

uint8_t* Rounds::stampedSlot(uint64_t round) {
    uint8_t* slot =
        state_.fabric->localWindow() + state_.layout.slot(state_.rank, static_cast<int>(round & 1));
    // Peers never write a rank's own slots, so the header is free for the
    // stamp. The fence keeps the stamp ahead of the piece written after it.
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(slot))
        .store(makeToken(state_.epoch, round), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    return slot + kHeaderBytes;
}

}  // namespace mooncake::pg::coll
