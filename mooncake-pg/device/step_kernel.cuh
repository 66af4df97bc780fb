// The step protocol of the chunked device collectives (device_group.h), and
// the kernel that runs it. A call of K steps runs K + 1 rounds in one kernel
// (allStepsKernel): round i waits for every member's flag of step i - 1,
// consumes that step (reads the members' windows), stages step i (writes
// this rank's window), and the last block to finish it raises step i's flag
// at every member. A flag thus means "staged this step and done reading the
// one before", so nothing is rewritten while a peer reads it.
//
// Data is staged in the owner's window and pulled by the readers: a byte
// needed by several members is written once. Each rank's region of a parity
// is the whole slots area of that parity in its window, size * slot_bytes.
//
// A collective supplies an Algo with
//   __device__ void run(const DeviceGroupView&, const StepArgs&) const;
// that consumes args.wait_step (when >= 0) and stages args.stage_step (when
// >= 0), both grid-stride over all threads of the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/launch_checks.h"
#include "mooncake-pg/device/reduce_ops.cuh"
#include "mooncake-pg/device/spin_wait.cuh"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::pg::device {

inline constexpr int kStepThreads = 512;

struct StepArgs {
    int64_t wait_step = -1;   // the step consumed, or -1
    int64_t stage_step = -1;  // the step staged and signalled, or -1
    int wait_parity = 0;
    int stage_parity = 0;
    uint64_t wait_tag = 0;
    uint64_t stage_tag = 0;
    uint64_t signature = 0;
    uint64_t call_tag = 0;   // step 0's tag: names the call in the failed-call word
    uint64_t seq = 0;        // the call's number
    bool ends_call = false;  // the call's last round: advances the call counter
    // Every block of the kernel arrives (blockArrive) `rounds` times, the
    // allStepsKernel once per step: the arrival counter resets only after
    // the kernel's final arrival.
    uint32_t rounds = 1;
};

__device__ __forceinline__ uint64_t* callCounter(const DeviceGroupView& g) {
    return reinterpret_cast<uint64_t*>(g.windows[g.rank] + kCallSeqOffset);
}

// The call's number: the owner's call counter when the group keeps it on
// the device (device_group.h), else the host's. The counter changes only in
// the call's last kernel, after every block has read it.
__device__ __forceinline__ uint64_t callSeq(const DeviceGroupView& g, uint64_t host_seq) {
    return g.seq_on_device ? *reinterpret_cast<volatile uint64_t*>(callCounter(g)) : host_seq;
}

// The last block of a call's last kernel, once every block of it is done:
// the next call's kernels, after this one on the stream, read the new number.
__device__ __forceinline__ void advanceCallSeq(const DeviceGroupView& g, uint64_t seq) {
    if (g.seq_on_device)
        *reinterpret_cast<volatile uint64_t*>(callCounter(g)) = seq + 1;
}

// One thread, as the call's last act on the device: every block's stores
// (ordered before this thread by the caller's barrier or arrival count)
// are visible system-wide before the host sees the call ended.
__device__ __forceinline__ void markCallEnded(DeviceOpResult* result) {
    __threadfence_system();
    *reinterpret_cast<volatile uint64_t*>(&result->ended) = 1;
}

// The start of a rank's data region of `parity` in a window.
__device__ __forceinline__ char* region(const DeviceGroupView& g, int src, int parity) {
    return g.windows[src] + slotOffset(parity, 0, g.size, g.slot_bytes);
}

__device__ __forceinline__ uint64_t globalThread() {
    return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t globalThreads() {
    return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// dst[0, n) = src[0, n) over all threads of the grid: 16-byte vectors with
// four loads in flight per thread when both ends allow it.
__device__ __forceinline__ void gridCopy(char* dst, const char* src, uint64_t n) {
    const uint64_t t = globalThread(), nt = globalThreads();
    uint64_t done = 0;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
        const int4* s4 = reinterpret_cast<const int4*>(src);
        int4* d4 = reinterpret_cast<int4*>(dst);
        const uint64_t vectors = n / 16;
        uint64_t i = t;
        for (; i + 3 * nt < vectors; i += 4 * nt) {
            int4 a = s4[i], b = s4[i + nt], c = s4[i + 2 * nt], d = s4[i + 3 * nt];
            d4[i] = a;
            d4[i + nt] = b;
            d4[i + 2 * nt] = c;
            d4[i + 3 * nt] = d;
        }
        for (; i < vectors; i += nt)
            d4[i] = s4[i];
        done = vectors * 16;
    } else if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 3) == 0) {
        const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
        uint32_t* d = reinterpret_cast<uint32_t*>(dst);
        const uint64_t words = n / 4;
        for (uint64_t i = t; i < words; i += nt)
            d[i] = s[i];
        done = words * 4;
    }
    for (uint64_t i = done + t; i < n; i += nt)
        dst[i] = src[i];
}

// Every thread of the block: whether the call may go on. Block 0 reads the
// host's words (two threads at once), then fails the call when its epoch is
// no longer current or, failing that, when the host set the abort word: a
// replay after a membership change says it is stale whatever else the host
// learnt meanwhile. Every block stops when the call already failed (in an
// earlier kernel, or in block 0 just now); blocks that raced past block 0's
// verdict only touch this rank's own memory, since flags are raised only
// for a call that has not failed.
__device__ __forceinline__ bool blockMayProceed(const DeviceGroupView& g, const StepArgs& a,
                                                DeviceOpResult* result) {
    __shared__ int stop;
    __shared__ uint64_t abort_seen, epoch_seen;
    if (threadIdx.x == 0)
        stop = 0;
    __syncthreads();
    const FailWord fail = failWordOf(g, a.call_tag);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        abort_seen = *g.abort_word;
    } else if (blockIdx.x == 0 && threadIdx.x == 1) {
        epoch_seen = *g.current_epoch;
    } else if (threadIdx.x == 2) {
        if (callFailed(fail))
            atomicOr(&stop, 1);
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0 &&
        !hostWordsAllow(g, epoch_seen, abort_seen, result, fail, -1))
        atomicOr(&stop, 1);
    __syncthreads();
    return stop == 0;
}

// Every thread of the block: waits for every member's flag of the step and
// compares the member's call signature with ours (kMismatch names the first
// differing member a thread sees).
//
// This rank's own flag comes first: the round's last block raises it with
// this rank's flags at every member, and nothing stops that loop once it
// has begun. A block that raced ahead of that last block and failed the
// call on a peer's differing signature would otherwise keep this rank's
// flags (and so its signature) from the peers, which would then wait for
// them until the op timeout and blame this rank instead of finding the
// mismatch themselves.
__device__ __forceinline__ bool blockWaitStep(const DeviceGroupView& g, const StepArgs& a,
                                              DeviceOpResult* result) {
    __shared__ int failed;
    if (threadIdx.x == 0)
        failed = 0;
    __syncthreads();
    char* own = g.windows[g.rank];
    const FailWord fail = failWordOf(g, a.call_tag);
    const auto waitMember = [&](int src) {
        return waitFlag(g, reinterpret_cast<const uint64_t*>(own + flagOffset(a.wait_parity, src)),
                        a.wait_tag, src, globalTimerNs(), result, fail, blockIdx.x == 0);
    };
    // One verdict for every thread (a shared word read here could already
    // hold a peer thread's failure below, and split the block at a barrier).
    if (__syncthreads_or(threadIdx.x == static_cast<unsigned>(g.rank) && !waitMember(g.rank)))
        return false;
    if (threadIdx.x < static_cast<unsigned>(g.size) &&
        threadIdx.x != static_cast<unsigned>(g.rank)) {
        const int src = static_cast<int>(threadIdx.x);
        if (!waitMember(src)) {
            atomicOr(&failed, 1);
        } else {
            const uint64_t theirs =
                *reinterpret_cast<volatile uint64_t*>(own + signatureOffset(a.wait_parity, src));
            if (theirs != a.signature) {
                failCall(result, fail, DeviceStatus::kMismatch, src, theirs);
                atomicOr(&failed, 1);
            }
        }
    }
    __syncthreads();
    return failed == 0;
}

// Every block, whether it did its work or not: counts itself in; the last
// one of a round, when the call has not failed and the round staged a step,
// publishes the signature and raises the step's flag at every member; in the
// call's last round it advances the call counter, and the kernel's final
// arrival marks the call ended in `result`. The system fences order every
// block's stores before the flags and that mark.
//
// The count runs over the kernel's rounds and resets after its final
// arrival, never between rounds: a round's blocks wait for that round's
// flags, so rounds stay apart; once the call failed they no longer wait and
// a fast block may arrive for a later round before slow ones arrive for an
// earlier one, which a reset between rounds would lose. Then the "last"
// arrivals fall to whichever blocks make each multiple of the grid, which
// raise nothing (the call failed) and at most advance the call counter to
// the same value again.
__device__ __forceinline__ void blockArrive(const DeviceGroupView& g, const StepArgs& a,
                                            DeviceOpResult* result) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        unsigned* counter = reinterpret_cast<unsigned*>(g.windows[g.rank] + kArrivalOffset);
        const unsigned arrived = atomicAdd(counter, 1u) + 1;
        last = arrived % gridDim.x == 0;
        if (last) {
            if (arrived == gridDim.x * a.rounds)
                atomicExch(counter, 0u);
            __threadfence_system();
            if (a.stage_step >= 0 && !callFailed(failWordOf(g, a.call_tag))) {
                for (int dst = 0; dst < g.size; ++dst) {
                    *reinterpret_cast<volatile uint64_t*>(
                        g.windows[dst] + signatureOffset(a.stage_parity, g.rank)) = a.signature;
                }
                __threadfence_system();
                for (int dst = 0; dst < g.size; ++dst) {
                    storeReleaseSys(reinterpret_cast<uint64_t*>(g.windows[dst] +
                                                                flagOffset(a.stage_parity, g.rank)),
                                    a.stage_tag);
                }
            }
            if (a.ends_call)
                advanceCallSeq(g, a.seq);
            // The kernel's final arrival, every block's every round counted:
            // nothing of the call runs after it, failed or not.
            if (a.ends_call && arrived == gridDim.x * a.rounds)
                markCallEnded(result);
        }
    }
}

// Round i of a call of `steps` steps (0 <= i <= steps).
MC_HOST_DEVICE inline StepArgs stepArgs(const DeviceGroupView& g, uint64_t steps, uint64_t seq,
                                        uint64_t signature, uint64_t i) {
    StepArgs a;
    a.signature = signature;
    a.seq = seq;
    a.ends_call = i == steps;
    a.call_tag = stepTag(g.epoch, seq, 0);
    a.rounds = static_cast<uint32_t>(steps + 1);
    if (i > 0) {
        a.wait_step = static_cast<int64_t>(i - 1);
        a.wait_parity = stepParity(seq, i - 1);
        a.wait_tag = stepTag(g.epoch, seq, i - 1);
    }
    if (i < steps) {
        a.stage_step = static_cast<int64_t>(i);
        a.stage_parity = stepParity(seq, i);
        a.stage_tag = stepTag(g.epoch, seq, i);
    }
    return a;
}

template <class Algo>
__device__ __forceinline__ void runStep(const DeviceGroupView& g, const Algo& algo,
                                        const StepArgs& a, DeviceOpResult* result) {
    bool ok = blockMayProceed(g, a, result);
    if (ok && a.wait_step >= 0)
        ok = blockWaitStep(g, a, result);
    if (ok)
        algo.run(g, a);
    blockArrive(g, a, result);
}

// Every step of a call in one kernel. Between steps nothing needs a kernel
// boundary: step i + 1 starts with blockWaitStep on every member's flag of
// step i, this rank's own included, and that flag goes up only once every
// block of this grid has arrived (blockArrive), its stores fenced. So the
// grid is also barriered, and one launch serves the whole call instead of
// steps + 1. The waits need the grid's blocks resident together: gridBlocks
// caps a member's grid at one block per SM per member, and two fit an SM.
template <class Algo>
__global__ void __launch_bounds__(kStepThreads, 2)
    allStepsKernel(DeviceGroupView g, Algo algo, uint64_t steps, uint64_t seq, uint64_t signature,
                   DeviceOpResult* result) {
    // Read before any block arrives at the last step: only then may the
    // counter advance.
    const uint64_t call = callSeq(g, seq);
    for (uint64_t i = 0; i <= steps; ++i)
        runStep(g, algo, stepArgs(g, steps, call, signature, i), result);
}

// Queues the call of `steps` steps (odd, from stepsFor) as one kernel.
// `chunk_bytes` sizes the grid.
template <class Algo>
Status launchSteps(const DeviceGroupView& g, const Algo& algo, uint64_t steps, uint64_t seq,
                   uint64_t signature, uint64_t chunk_bytes, DeviceOpResult* result,
                   cudaStream_t stream, const char* what) {
    const unsigned blocks = gridBlocks(g, chunk_bytes);
    allStepsKernel<Algo>
        <<<blocks, kStepThreads, 0, stream>>>(g, algo, steps, seq, signature, result);
    return cudaLaunchStatus(what);
}

}  // namespace mooncake::pg::device
