// One IBGDA queue pair as the send blocks of the EP kernels share it. The
// queue code of mlx5_queues.h assumes one producer; here many blocks post to
// the same QP (every block whose destination maps to it), so each post and
// each reap runs under the channel's spin lock, and the queue counters live
// in the channel (device memory) between turns. Header-only and
// __host__ __device__: the host tests run it from threads against the
// software HCA, the kernels from one thread per block.
//
// Rules a caller relies on:
//   * every wait (for the lock, for room, for completions) ends by the
//     caller's deadline: a peer that stopped answering leaves its QP's WQEs
//     unexecuted, and a sender must not spin on it for ever;
//   * an error completion marks the channel failed for good (the QP is in
//     error and flushes the rest); every later call returns kQpError;
//   * WRITEs are not announced one by one: the next put-with-count (or a
//     quiet, or a wait for room) rings the doorbell for all of them, and at
//     least every quarter of the ring one WRITE asks for a completion, so a
//     producer waiting for room always has a completion coming.
// Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <cstdint>

#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"

namespace mooncake::ep {

namespace mlx5q = te::rdma::mlx5;

// The fewest WQEs a channel's ring may have: a quarter of it must hold a
// WRITE and a put-with-count.
inline constexpr uint32_t kIbgdaMinChannelWqes = 8;

struct IbgdaChannel {
    // The queues as mapped for the poster; their counters are the channel's
    // state and change only under `lock`.
    mlx5q::SendQueue sq;
    mlx5q::CompletionQueue cq;
    uint32_t last_signaled = 0;  // producer count just after the last signaled WQE
    uint32_t rung = 0;           // producer count the doorbell last announced
    int32_t lock = 0;            // 0 free, 1 held
    int32_t failed = 0;          // 1 after an error completion
    uint32_t syndrome = 0;       // that completion's syndrome
};

enum class IbgdaStatus : int32_t { kOk = 0, kQpError = 1, kTimedOut = 2 };

MC_HOST_DEVICE uint32_t ibgdaLoad(const uint32_t* p) {
    return *static_cast<const volatile uint32_t*>(p);
}
MC_HOST_DEVICE void ibgdaStore(uint32_t* p, uint32_t v) {
    *static_cast<volatile uint32_t*>(p) = v;
}
MC_HOST_DEVICE uint64_t ibgdaLoad(const uint64_t* p) {
    return *static_cast<const volatile uint64_t*>(p);
}
MC_HOST_DEVICE void ibgdaStore(uint64_t* p, uint64_t v) {
    *static_cast<volatile uint64_t*>(p) = v;
}

MC_HOST_DEVICE bool ibgdaTryLock(int32_t* lock) {
#if defined(__CUDA_ARCH__)
    if (atomicCAS(lock, 0, 1) != 0)
        return false;
    __threadfence();
    return true;
#else
    int32_t expected = 0;
    return __atomic_compare_exchange_n(lock, &expected, 1, false, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
#endif
}

MC_HOST_DEVICE void ibgdaUnlock(int32_t* lock) {
#if defined(__CUDA_ARCH__)
    // System scope: the next holder may ring the doorbell for the WQEs this
    // holder wrote, and the NIC reads them over PCIe.
    __threadfence_system();
    atomicExch(lock, 0);
#else
    __atomic_store_n(lock, 0, __ATOMIC_RELEASE);
#endif
}

// A channel while its lock is held: the queues with the counters as the last
// holder left them (read with volatile loads: another SM wrote them).
struct IbgdaHeld {
    IbgdaChannel* ch = nullptr;
    mlx5q::SendQueue sq;
    mlx5q::CompletionQueue cq;
    uint32_t last_signaled = 0;
    uint32_t rung = 0;
};

MC_HOST_DEVICE bool ibgdaPastDeadline(int64_t now, int64_t deadline) {
    return deadline >= 0 && now > deadline;
}

// Takes the lock by `deadline` (< 0: no deadline); `now()` returns the time
// in the deadline's unit.
template <typename Now>
MC_HOST_DEVICE IbgdaStatus ibgdaAcquire(IbgdaChannel* ch, int64_t deadline, Now now, IbgdaHeld* h) {
    for (uint32_t spins = 0; !ibgdaTryLock(&ch->lock); ++spins) {
#if defined(__CUDA_ARCH__)
        __nanosleep(64);  // spinners must not starve the holder's memory traffic
#endif
        if ((spins & 15) == 15 && ibgdaPastDeadline(now(), deadline))
            return IbgdaStatus::kTimedOut;
    }
    h->ch = ch;
    h->sq = ch->sq;
    h->cq = ch->cq;
    h->sq.producer = ibgdaLoad(&ch->sq.producer);
    h->sq.consumer = ibgdaLoad(&ch->sq.consumer);
    // The last WQE's doorbell word: a WRITE queued by an earlier holder is
    // rung by a later one.
    h->sq.doorbell_word = ibgdaLoad(&ch->sq.doorbell_word);
    h->cq.consumer = ibgdaLoad(&ch->cq.consumer);
    h->last_signaled = ibgdaLoad(&ch->last_signaled);
    h->rung = ibgdaLoad(&ch->rung);
    if (*static_cast<const volatile int32_t*>(&ch->failed) != 0) {
        ibgdaUnlock(&ch->lock);
        return IbgdaStatus::kQpError;
    }
    return IbgdaStatus::kOk;
}

MC_HOST_DEVICE void ibgdaRelease(IbgdaHeld& h) {
    IbgdaChannel* ch = h.ch;
    ibgdaStore(&ch->sq.producer, h.sq.producer);
    ibgdaStore(&ch->sq.consumer, h.sq.consumer);
    ibgdaStore(&ch->sq.doorbell_word, h.sq.doorbell_word);
    ibgdaStore(&ch->cq.consumer, h.cq.consumer);
    ibgdaStore(&ch->last_signaled, h.last_signaled);
    ibgdaStore(&ch->rung, h.rung);
    ibgdaUnlock(&ch->lock);
}

// Announces every WQE written so far.
MC_HOST_DEVICE void ibgdaRing(IbgdaHeld& h) {
    if (h.rung == h.sq.producer)
        return;
    mlx5q::ringDoorbell(h.sq);
    h.rung = h.sq.producer;
}

// Reaps what has completed; kQpError (and the channel marked failed) at an
// error completion.
MC_HOST_DEVICE IbgdaStatus ibgdaReap(IbgdaHeld& h) {
    mlx5q::Completion error;
    if (mlx5q::reapCompletions(h.cq, h.sq, &error))
        return IbgdaStatus::kOk;
    ibgdaStore(&h.ch->syndrome, error.syndrome);
    *static_cast<volatile int32_t*>(&h.ch->failed) = 1;
    return IbgdaStatus::kQpError;
}

// Waits, lock held, until `bbs` BBs are free.
template <typename Now>
MC_HOST_DEVICE IbgdaStatus ibgdaWaitForRoom(IbgdaHeld& h, uint32_t bbs, int64_t deadline, Now now) {
    while (mlx5q::freeBasicBlocks(h.sq) < bbs) {
        ibgdaRing(h);  // what waits in the ring must reach the NIC to complete
        const IbgdaStatus st = ibgdaReap(h);
        if (st != IbgdaStatus::kOk)
            return st;
        if (mlx5q::freeBasicBlocks(h.sq) < bbs && ibgdaPastDeadline(now(), deadline))
            return IbgdaStatus::kTimedOut;
    }
    return IbgdaStatus::kOk;
}

// Queues up to `n` WRITEs in one turn of the lock (fewer lock round trips
// than one ibgdaWrite each, e.g. the rows a combine warp returns).
// describe(j, &local_addr, &remote_addr, &length) tells the j-th, or false
// to skip it; all use `lkey` and `rkey`. On an error the WRITEs already
// queued stay queued.
template <typename Describe, typename Now>
MC_HOST_DEVICE IbgdaStatus ibgdaWriteMany(IbgdaChannel* ch, int n, uint32_t lkey, uint32_t rkey,
                                          Describe describe, int64_t deadline, Now now) {
    IbgdaHeld h;
    IbgdaStatus st = ibgdaAcquire(ch, deadline, now, &h);
    if (st != IbgdaStatus::kOk)
        return st;
    for (int j = 0; j < n && st == IbgdaStatus::kOk; ++j) {
        uint64_t local = 0, remote = 0;
        uint32_t length = 0;
        if (!describe(j, &local, &remote, &length))
            continue;
        st = ibgdaWaitForRoom(h, 1, deadline, now);
        if (st != IbgdaStatus::kOk)
            break;
        const bool signaled = h.sq.producer + 1 - h.last_signaled >= h.sq.wqe_count / 4;
        mlx5q::postWrite(h.sq, local, lkey, remote, rkey, length, signaled);
        if (signaled)
            h.last_signaled = h.sq.producer;
    }
    ibgdaRelease(h);
    return st;
}

// Queues an RDMA WRITE of `length` bytes (not announced yet: see above).
template <typename Now>
MC_HOST_DEVICE IbgdaStatus ibgdaWrite(IbgdaChannel* ch, uint64_t local_addr, uint32_t lkey,
                                      uint64_t remote_addr, uint32_t rkey, uint32_t length,
                                      int64_t deadline, Now now) {
    return ibgdaWriteMany(
        ch, 1, lkey, rkey,
        [&](int, uint64_t* local, uint64_t* remote, uint32_t* bytes) {
            *local = local_addr;
            *remote = remote_addr;
            *bytes = length;
            return true;
        },
        deadline, now);
}

// Posts `p` (its WRITE if any, then the signaled fetch-add) and rings the
// doorbell for it and every WRITE queued before it.
template <typename Now>
MC_HOST_DEVICE IbgdaStatus ibgdaPutWithCount(IbgdaChannel* ch, const mlx5q::PutWithCount& p,
                                             int64_t deadline, Now now) {
    IbgdaHeld h;
    IbgdaStatus st = ibgdaAcquire(ch, deadline, now, &h);
    if (st != IbgdaStatus::kOk)
        return st;
    st = ibgdaWaitForRoom(h, mlx5q::basicBlocksFor(p), deadline, now);
    if (st == IbgdaStatus::kOk) {
        mlx5q::postPutWithCount(h.sq, p);  // room checked: cannot refuse
        h.rung = h.sq.producer;
        h.last_signaled = h.sq.producer;
    }
    ibgdaRelease(h);
    return st;
}

// Whether the completions reaped so far reach `target`, read without the
// lock: the consumer count only grows, and only after its CQEs were seen.
MC_HOST_DEVICE bool ibgdaReapedThrough(IbgdaChannel* ch, uint32_t target) {
    const bool reached = static_cast<int32_t>(ibgdaLoad(&ch->sq.consumer) - target) >= 0;
#if defined(__CUDA_ARCH__)
    __threadfence();  // the caller reuses what those WQEs read only after this load
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
    return reached;
}

// Waits until every signaled WQE posted to the channel before this call has
// completed, and with it every WQE before that one: the local memory they
// read may be reused. The lock is taken for each poll only, and only while
// the completions another holder reaped do not reach the target yet, with a
// growing pause between polls, so blocks posting to the channel meanwhile
// are not kept waiting behind the pollers.
template <typename Now>
MC_HOST_DEVICE IbgdaStatus ibgdaQuiet(IbgdaChannel* ch, int64_t deadline, Now now) {
    bool have_target = false;
    uint32_t target = 0;
    for (uint32_t pause_ns = 64;; pause_ns = pause_ns < 1024 ? 2 * pause_ns : pause_ns) {
        if (have_target) {
            if (*static_cast<const volatile int32_t*>(&ch->failed) != 0)
                return IbgdaStatus::kQpError;
            if (ibgdaReapedThrough(ch, target))
                return IbgdaStatus::kOk;
        }
        IbgdaHeld h;
        IbgdaStatus st = ibgdaAcquire(ch, deadline, now, &h);
        if (st != IbgdaStatus::kOk)
            return st;
        if (!have_target) {
            target = h.last_signaled;
            have_target = true;
        }
        ibgdaRing(h);
        st = ibgdaReap(h);
        const bool done = static_cast<int32_t>(h.sq.consumer - target) >= 0;
        ibgdaRelease(h);
        if (st != IbgdaStatus::kOk)
            return st;
        if (done)
            return IbgdaStatus::kOk;
        if (ibgdaPastDeadline(now(), deadline))
            return IbgdaStatus::kTimedOut;
#if defined(__CUDA_ARCH__)
        __nanosleep(pause_ns);  // the completion is a PCIe round trip away at best
#endif
    }
}

}  // namespace mooncake::ep
