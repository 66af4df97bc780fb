// Waiting on flags in device memory, bounded: every spin re-reads the flag
// with acquire semantics at system scope (peers in other processes write it),
// and checks the host's abort word and a %globaltimer deadline.
#pragma once

#include <cstdint>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/device_sync.cuh"

namespace mooncake::pg::device {

// Records the first failure of the call; later ones are dropped.
__device__ __forceinline__ void reportFailure(DeviceOpResult* result, DeviceStatus status,
                                              int culprit, uint64_t detail) {
    if (atomicCAS(reinterpret_cast<int*>(&result->status), 0, static_cast<int>(status)) == 0) {
        result->culprit = culprit;
        result->detail = detail;
        __threadfence_system();
    }
}

// Spins until *flag == tag. On the deadline or an abort, reports it (blaming
// `peer`) and returns false. `start_ns` is when the call began waiting.
__device__ __forceinline__ bool waitFlag(const DeviceGroupView& g, const uint64_t* flag,
                                         uint64_t tag, int peer, uint64_t start_ns,
                                         DeviceOpResult* result) {
    for (uint32_t spins = 0;; ++spins) {
        if (loadAcquireSys(flag) == tag)
            return true;
        // The clock and the host word are read every few spins: both cost a
        // trip outside the SM.
        if ((spins & 63) == 0) {
            uint64_t abort = *g.abort_word;
            if (abort != 0) {
                reportFailure(result, DeviceStatus::kAborted, peer, abort);
                return false;
            }
            if (g.timeout_ns >= 0 &&
                globalTimerNs() - start_ns > static_cast<uint64_t>(g.timeout_ns)) {
                reportFailure(result, DeviceStatus::kTimeout, peer, 0);
                return false;
            }
            // Another thread (or block) already failed the call.
            if (*reinterpret_cast<volatile int32_t*>(&result->status) != 0)
                return false;
        }
    }
}

}  // namespace mooncake::pg::device
