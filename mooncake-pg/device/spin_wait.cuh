// Waiting on flags in device memory, bounded: every spin re-reads the flag
// with acquire semantics at system scope (peers in other processes write it),
// and checks a %globaltimer deadline, the call's failure and (in one block)
// the host's abort word and epoch.
#pragma once

#include <cstdint>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/device_sync.cuh"

namespace mooncake::pg::device {

// Records the first failure of the call; later ones are dropped. The status
// goes last, so a host reading the result while kernels run (a replay's)
// never sees a failure without its culprit and detail.
__device__ __forceinline__ void reportFailure(DeviceOpResult* result, DeviceStatus status,
                                              int culprit, uint64_t detail) {
    int* word = reinterpret_cast<int*>(&result->status);
    if (atomicCAS(word, 0, static_cast<int>(DeviceStatus::kClaimed)) == 0) {
        *reinterpret_cast<volatile int32_t*>(&result->culprit) = culprit;
        *reinterpret_cast<volatile uint64_t*>(&result->detail) = detail;
        __threadfence_system();
        atomicExch(word, static_cast<int>(status));
        __threadfence_system();
    }
}

// A call's failure as the device sees it: the step-0 tag of the call in the
// owner's failed-call word (device_group.h). Set with the host result by
// failCall; read by spinning threads instead of the host-mapped result.
struct FailWord {
    uint64_t* word;
    uint64_t call_tag;
};

__device__ __forceinline__ FailWord failWordOf(const DeviceGroupView& g, uint64_t call_tag) {
    return FailWord{reinterpret_cast<uint64_t*>(g.windows[g.rank] + kFailedCallOffset), call_tag};
}

__device__ __forceinline__ bool callFailed(const FailWord& f) {
    return *reinterpret_cast<volatile uint64_t*>(f.word) == f.call_tag;
}

// Records the failure in the host result (first one wins) and the device word.
__device__ __forceinline__ void failCall(DeviceOpResult* result, const FailWord& f,
                                         DeviceStatus status, int culprit, uint64_t detail) {
    reportFailure(result, status, culprit, detail);
    *reinterpret_cast<volatile uint64_t*>(f.word) = f.call_tag;
    __threadfence();
}

// The host's verdict on a call from its two words, as read: stale first (a
// replay after a membership change must say so, so that the user captures
// again, whatever else the host learnt meanwhile), then the abort word
// (blaming `abort_culprit`). Fails the call and returns false when either
// says stop. A replay compares its epoch with the latest committed one; an
// eager call's epoch word changes only between calls.
__device__ __forceinline__ bool hostWordsAllow(const DeviceGroupView& g, uint64_t epoch_seen,
                                               uint64_t abort_seen, DeviceOpResult* result,
                                               const FailWord& fail, int abort_culprit) {
    if (epoch_seen != g.epoch) {
        failCall(result, fail, DeviceStatus::kStaleEpoch, -1, epoch_seen);
        return false;
    }
    if (abort_seen != 0) {
        failCall(result, fail, DeviceStatus::kAborted, abort_culprit, abort_seen);
        return false;
    }
    return true;
}

// Spins until *flag == tag. On the deadline or an abort, fails the call
// (blaming `peer`) and returns false; returns false as well once another
// thread failed the call, or the call's epoch is no longer current (stale).
// `start_ns` is when the call began waiting. Only threads with `watch_abort`
// read the host's abort and epoch words (one block's worth
// is enough: the failure they record reaches the others through `fail`).
__device__ __forceinline__ bool waitFlag(const DeviceGroupView& g, const uint64_t* flag,
                                         uint64_t tag, int peer, uint64_t start_ns,
                                         DeviceOpResult* result, const FailWord& fail,
                                         bool watch_abort) {
    for (uint32_t spins = 0;; ++spins) {
        if (loadAcquireSys(flag) == tag)
            return true;
        // The clock and the other words are read every few spins: they cost
        // a trip outside the SM.
        if ((spins & 63) == 0) {
            // A membership change committed while a replay waits may have
            // taken out the peer it waits on.
            if (watch_abort) {
                const uint64_t epoch_seen = *g.current_epoch;
                if (!hostWordsAllow(g, epoch_seen, *g.abort_word, result, fail, peer))
                    return false;
            }
            if (g.timeout_ns >= 0 &&
                globalTimerNs() - start_ns > static_cast<uint64_t>(g.timeout_ns)) {
                // The peer's last signal says how far it got (resultStatus).
                failCall(result, fail, DeviceStatus::kTimeout, peer, loadAcquireSys(flag));
                return false;
            }
            if (callFailed(fail))
                return false;
        }
        // After a while, back off a little: hundreds of threads polling the
        // same lines slow the peers' copies that would raise the flag.
        if (spins > 256)
            __nanosleep(64);
    }
}

}  // namespace mooncake::pg::device
