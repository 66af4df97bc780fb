// Device-side ordering and waiting for the EP kernels. Peers' buffers are
// mapped device memory (same GPU or another GPU of the host), so signals use
// system-scope release/acquire: a release store publishes every write the
// block made before it (the block meets at __syncthreads and the signalling
// thread fences first).
#pragma once

#include <cstdint>

#include "mooncake-ep/core/signal_word.h"
#include "mooncake-transfer-engine/common/device_sync.cuh"

namespace mooncake::ep {

__device__ __forceinline__ int32_t epLoadVolatile(const int32_t* p) {
    return *static_cast<const volatile int32_t*>(p);
}

// Called by the block's signalling thread after __syncthreads: the block's
// writes to the peer, then the signal.
__device__ __forceinline__ void epSignal(uint64_t* word, uint64_t seq, uint32_t payload) {
    __threadfence_system();
    storeReleaseSys(word, epMakeSignal(seq, payload));
}

enum class EpWait { kArrived, kTimedOut, kPeerInactive };

// Spins until poll(&payload) is true. Gives up when another block marked the
// peer inactive, or after timeout_ns (< 0: never), and then marks it
// inactive itself. Never traps.
template <typename Poll>
__device__ inline EpWait epWaitFor(int32_t* peer_active, int64_t timeout_ns, uint32_t* payload,
                                   Poll poll) {
    const uint64_t start = globalTimerNs();
    for (uint32_t spins = 0;; ++spins) {
        if (poll(payload))
            return EpWait::kArrived;
        // Checked every few spins: the timer read and the flag load are not free.
        if ((spins & 63) == 63) {
            if (epLoadVolatile(peer_active) == 0)
                return EpWait::kPeerInactive;
            if (timeout_ns >= 0 && globalTimerNs() - start > static_cast<uint64_t>(timeout_ns)) {
                atomicExch(peer_active, 0);
                return EpWait::kTimedOut;
            }
        }
    }
}

// Waits (as epWaitFor) until `word` carries `seq`; its payload goes to `payload`.
__device__ inline EpWait epWaitSignal(const uint64_t* word, uint64_t seq, int32_t* peer_active,
                                      int64_t timeout_ns, uint32_t* payload) {
    return epWaitFor(peer_active, timeout_ns, payload, [&](uint32_t* out) {
        const uint64_t v = loadAcquireSys(word);
        if (!epSignalMatches(v, seq))
            return false;
        *out = epSignalPayload(v);
        return true;
    });
}

// For a kernel queued after one that waited (epWaitSignal) for the same
// word: kArrived with the payload when `word` carries `seq`, else
// kTimedOut (that wait gave up). Never spins.
__device__ inline EpWait epPeekSignal(const uint64_t* word, uint64_t seq, uint32_t* payload) {
    const uint64_t v = loadAcquireSys(word);
    if (!epSignalMatches(v, seq))
        return EpWait::kTimedOut;
    *payload = epSignalPayload(v);
    return EpWait::kArrived;
}

// A receive's wait for `word`: epPeekSignal in the copy kernel of a split
// receive (kPeek, its wait kernel has spun already), else epWaitSignal.
template <bool kPeek>
__device__ inline EpWait epAwaitSignal(const uint64_t* word, uint64_t seq, int32_t* peer_active,
                                       int64_t timeout_ns, uint32_t* payload) {
    if (kPeek)
        return epPeekSignal(word, seq, payload);
    return epWaitSignal(word, seq, peer_active, timeout_ns, payload);
}

// The last block of a grid to call this (once per block, thread 0) stores
// `seq` as the completed operation and resets the counter for the next one.
// Every block read the previous value at its start, before any block got here.
// It also copies the error words (code, info) to `mirror` when there is one:
// every block reported its errors before it got here.
__device__ inline void epFinishOperation(uint32_t* done, uint64_t* completed_seq, uint64_t seq,
                                         const int32_t* error_words, int32_t* mirror) {
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x * gridDim.y - 1) {
        *done = 0;
        *static_cast<volatile uint64_t*>(completed_seq) = seq;
        if (mirror != nullptr) {
            __threadfence();  // the other blocks' reports, before their count
            const volatile int32_t* words = error_words;
            mirror[1] = words[1];
            mirror[0] = words[0];
        }
        __threadfence();
    }
}

// Reports a bad argument seen on the device; the first report wins.
__device__ inline void epReportError(int32_t* code, int32_t* info, int32_t error, int32_t value) {
    if (atomicCAS(code, 0, error) == 0)
        atomicExch(info, value);
}

}  // namespace mooncake::ep
