// The parts of the dispatch/combine kernels that do not depend on how bytes
// reach a peer: finding the tokens of an expert, packing what arrived, and
// the weighted reduction. The cuda_ipc kernels (dispatch.cu, combine.cu) and
// the NCCL device-API kernels (mooncake-ep/nccl) differ only in how they
// write to a peer and how they wait for a signal word, which they pass in.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "mooncake-ep/core/dispatch_slots.h"
#include "mooncake-ep/core/handle.h"
#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/direct_dispatch.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-ep/kernels/message.cuh"

namespace mooncake::ep {

// Host: calls launch(std::integral_constant<int, T>{}) with T = `threads`,
// one of the block sizes epSendThreads chooses, so that a send kernel is
// compiled for each.
template <typename Launch>
void epWithSendThreads(int threads, Launch launch) {
    switch (threads) {
        case 128:
            launch(std::integral_constant<int, 128>{});
            break;
        case 256:
            launch(std::integral_constant<int, 256>{});
            break;
        default:
            launch(std::integral_constant<int, kEpMaxSendThreads>{});
            break;
    }
}

// Thread 0 of the block records `mark` of `kernel` when tracing is on
// (core/phase_trace.h).
__device__ inline void epTrace(const EpGroupArgs& g, EpTraceKernel kernel, EpTraceMark mark) {
    if (g.phase_trace != nullptr && threadIdx.x == 0 && blockIdx.x < kEpTraceMaxBlocks)
        g.phase_trace[epTraceSlot(kernel, static_cast<int>(blockIdx.x), mark)] = globalTimerNs();
}

// What one send block of an operation works on. Dispatch has a block per
// global expert; combine a block per (local expert, destination rank).
struct EpSendBlock {
    int dst;           // the rank written to
    int local_expert;  // the expert's index on the rank that owns it
    int expert;        // the global expert
    uint64_t seq;      // the operation's sequence number
    int phase;         // seq & 1: the half of the buffer this operation uses
    // Nothing goes to an inactive rank, not even its signal; a rank inactive
    // in its own view sends nothing at all (as the fallback does). One read
    // for the whole block: active_ranks may change under a running kernel (a
    // receive block's timeout marks a rank), and threads that decided
    // differently would leave the others at a __syncthreads. Every thread of
    // the block must call it.
    __device__ bool active(const EpGroupArgs& g) const {
        __shared__ int block_active;
        if (threadIdx.x == 0) {
            block_active = epLoadVolatile(&g.active_ranks[dst]) != 0 &&
                           epLoadVolatile(&g.active_ranks[g.rank]) != 0;
        }
        __syncthreads();
        return block_active != 0;
    }
};

__device__ inline EpSendBlock epDispatchSendBlock(const EpGroupArgs& g, const EpLayout& L) {
    const int nle = static_cast<int>(L.numLocalExperts());
    EpSendBlock b;
    b.expert = blockIdx.x;
    b.dst = b.expert / nle;
    b.local_expert = b.expert % nle;
    b.seq = epState(g.local_buffer)->dispatch_seq + 1;
    b.phase = static_cast<int>(b.seq & 1);
    return b;
}

__device__ inline EpSendBlock epCombineSendBlock(const EpGroupArgs& g, const EpLayout& L) {
    EpSendBlock b;
    b.local_expert = blockIdx.x / g.num_ranks;
    b.dst = blockIdx.x % g.num_ranks;
    b.expert = g.rank * static_cast<int>(L.numLocalExperts()) + b.local_expert;
    b.seq = epState(g.local_buffer)->combine_seq + 1;
    b.phase = static_cast<int>(b.seq & 1);
    return b;
}

// Block 0 of a dispatch reports ids outside [-1, num_experts).
__device__ inline void epCheckExpertIds(const EpGroupArgs& g, const DispatchArgs& a,
                                        EpState* state) {
    for (int i = threadIdx.x; i < a.num_tokens * a.top_k; i += blockDim.x) {
        const int64_t id = a.topk_idx[i];
        if (id < -1 || id >= g.num_experts)
            epReportError(&state->error_code, &state->error_info, kEpErrorBadExpertId,
                          static_cast<int32_t>(id));
    }
}

// Calls write(slot, token, lane) once per token that selected `expert`, one
// warp per token, slots in token order (so they are deterministic). Returns
// how many; every thread of the block must call it.
template <int kThreads, typename Write>
__device__ int epForEachSelected(const DispatchArgs& a, int expert, Write write) {
    constexpr int kWarps = kThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __shared__ int warp_counts[kWarps];
    __shared__ int chosen[kThreads];
    int sent = 0;
    for (int first = 0; first < a.num_tokens; first += kThreads) {
        const int token = first + threadIdx.x;
        const bool selected =
            token < a.num_tokens && epRowSelects(a.topk_idx, a.top_k, token, expert);
        const unsigned ballot = __ballot_sync(0xffffffffu, selected);
        if (lane == 0)
            warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, chunk = 0;
        for (int w = 0; w < kWarps; ++w) {
            before += w < warp ? warp_counts[w] : 0;
            chunk += warp_counts[w];
        }
        if (selected)
            chosen[before + __popc(ballot & ((1u << lane) - 1))] = token;
        __syncthreads();
        for (int i = warp; i < chunk; i += kWarps)
            write(sent + i, chosen[i], lane);
        sent += chunk;
        __syncthreads();  // `chosen` and `warp_counts` are reused
    }
    return sent;
}

// A receive pair's begin with this bit: its rows are in the slot the
// receiving rank named (direct dispatch), not in messages.
inline constexpr int kEpFromSlot = 1 << 30;

// Direct receive: rows [0, end) of `expert` that no source's range in
// layout_range covers (reserved by a source whose count did not arrive)
// get src_info -1, so that combine never returns them. One thread; only
// when the ranges leave a gap.
__device__ inline void epDirectMarkHoles(const DispatchArgs& a, int expert, int64_t capacity,
                                         int num_ranks, int end) {
    const int64_t* ranges = a.layout_range + static_cast<int64_t>(expert) * num_ranks;
    for (int row = 0; row < end;) {
        int next = row;  // the end of a range that covers `row`, if any
        for (int src = 0; src < num_ranks; ++src) {
            const int begin = epRangeBegin(ranges[src]), count = epRangeCount(ranges[src]);
            if (count > 0 && begin <= row && row < begin + count)
                next = begin + count;
        }
        if (next == row) {
            a.src_info[expert * capacity + row] = -1;
            ++next;
        }
        row = next;
    }
}

// Thread 0 of a direct receive round: where each (expert, source) pair's
// rows go and which need copying (counts[p]: rows to copy; begins[p]: first
// output row, with kEpFromSlot when they are in slot `named`), the experts'
// part of the handle and recv_count. Into the op's slot (a.direct_slot),
// rows already there stay and the others go to rows reserved on the same
// counter; into tensors of their own, everything is copied, packed in
// source order. Rows reserved by a source whose count did not arrive are
// holes: counted, src_info -1 (epDirectMarkHoles). Not inlined: the kernel
// would keep its registers through the copy loop.
__device__ inline void epDirectPlacePairs(const EpGroupArgs& g, const DispatchArgs& a,
                                          const EpLayout& L, int* counts, int* begins, int* firsts,
                                          int first, int pairs, uint64_t seq, int named) {
    const int num_ranks = g.num_ranks;
    const int phase = static_cast<int>(seq & 1);
    const int64_t capacity = L.capacity();
    char* own = static_cast<char*>(g.local_buffer);
    const auto expertOf = [&](int p) {
        return first + (p / num_ranks) * static_cast<int>(gridDim.x);
    };
    const int out = a.direct_slot;
    int in_expert = 0, end = 0, in_round = 0;
    for (int p = 0; p < pairs; ++p) {
        const int src = p % num_ranks;
        const int expert = expertOf(p);
        if (src == 0)
            in_expert = end = 0;
        int count = counts[p];
        bool from_slot = false, in_place = false;
        uint32_t begin = static_cast<uint32_t>(in_expert);
        if (count > 0) {
            const uint64_t word = __ldcg(reinterpret_cast<const unsigned long long*>(
                own + L.directBaseOffset(phase, expert, src)));
            if (epSignalMatches(word, seq)) {
                const uint32_t at = epSignalPayload(word);
                from_slot = named >= 0 && at != kEpDirectRefused &&
                            static_cast<int64_t>(at) + count <= capacity;
                count = from_slot ? count : 0;  // nowhere to read them from
                in_place = from_slot && named == out;
                begin = in_place ? at : begin;
            }
        }
        if (count > 0 && out >= 0 && !in_place) {
            begin = epDirectReserve(
                reinterpret_cast<uint64_t*>(own + L.directCounterOffset(out, expert)), seq,
                static_cast<uint32_t>(count));
        }
        if (begin == kEpDirectRefused || static_cast<int64_t>(begin) + count > capacity) {
            begin = 0;  // a counter gone wrong: drop, never write past
            count = 0;
        }
        begins[p] = static_cast<int>(begin) | (from_slot ? kEpFromSlot : 0);
        firsts[p] = in_round;
        counts[p] = in_place ? 0 : count;  // rows to copy
        a.layout_range[static_cast<int64_t>(expert) * num_ranks + src] =
            epEncodeRange(static_cast<int>(begin), count);
        in_expert += count;
        end = count > 0 ? max(end, static_cast<int>(begin) + count) : end;
        in_round += counts[p];
        if (src == num_ranks - 1) {
            a.packed_recv_count[expert] = out >= 0 ? end : in_expert;
            if (out >= 0 && end != in_expert)
                epDirectMarkHoles(a, expert, capacity, num_ranks, end);
        }
    }
}

// One round of a dispatch receive block: `experts` of its local experts,
// first, first + gridDim.x, ..., one (expert, source) pair each per source.
// It waits for every pair's count at once, one thread per pair with
// wait(src, word_offset, seq, &count) -> EpWait, so no expert's wait holds
// up another's; then writes the experts' part of the handle and packs each
// expert's messages in source-rank order, all the round's messages spread
// over all warps (a source with a few tokens leaves no warp idle). `shared`
// holds 3 * experts * num_ranks ints; every thread of the block calls it.
template <int kThreads, typename Wait>
__device__ void epDispatchReceiveRound(const EpGroupArgs& g, const DispatchArgs& a, int* shared,
                                       int first, int experts, uint64_t seq, Wait wait) {
    constexpr int kWarps = kThreads / 32;
    const EpLayout L = epLayoutOf(g);
    const int num_ranks = g.num_ranks;
    const int pairs = experts * num_ranks;
    const int phase = static_cast<int>(seq & 1);
    // Pair p is (expert expertOf(p), source p % num_ranks): its count, its
    // first row among the expert's packed rows, its first message in the round.
    int* counts = shared;
    int* begins = shared + pairs;
    int* firsts = shared + 2 * pairs;
    const auto expertOf = [&](int p) {
        return first + (p / num_ranks) * static_cast<int>(gridDim.x);
    };

    // A rank inactive in its own view receives nothing (no peer sends to it).
    const bool self_active = epLoadVolatile(&g.active_ranks[g.rank]) != 0;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int src = p % num_ranks;
        uint32_t count = 0;
        if (self_active && epLoadVolatile(&g.active_ranks[src]) != 0) {
            if (wait(src, L.dispatchCountOffset(phase, expertOf(p), src), seq, &count) !=
                EpWait::kArrived)
                count = 0;  // the rank is out: its messages, if any, are ignored
        }
        // A count is the peer's word: never trust it past the region.
        counts[p] = static_cast<int>(min(count, static_cast<uint32_t>(g.max_tokens)));
    }
    __syncthreads();
    const int64_t capacity = static_cast<int64_t>(num_ranks) * g.max_tokens;
    // Direct dispatch (direct_dispatch.cuh): rows of a source whose base word
    // carries the op's number are in the slot this rank named for the op.
    const bool direct = a.direct && a.use_fp8;
    char* own = static_cast<char*>(g.local_buffer);
    const int named = direct ? epDirectNamedSlot(own, L, seq) : -1;
    __shared__ EpSlotView slot_view;
    if (threadIdx.x == 0 && direct) {
        epDirectPlacePairs(g, a, L, counts, begins, firsts, first, pairs, seq, named);
        if (named >= 0)
            slot_view = epSlotViewOf(own, L, named, phase);
        if (first == static_cast<int>(blockIdx.x))
            epTrace(g, kEpTraceDispatchReceive, kEpTraceMiddle);
    } else if (threadIdx.x == 0) {
        int in_expert = 0, in_round = 0;
        for (int p = 0; p < pairs; ++p) {
            const int src = p % num_ranks;
            const int expert = expertOf(p);
            if (src == 0)
                in_expert = 0;
            begins[p] = in_expert;
            firsts[p] = in_round;
            a.layout_range[static_cast<int64_t>(expert) * num_ranks + src] =
                epEncodeRange(in_expert, counts[p]);
            in_expert += counts[p];
            in_round += counts[p];
            if (src == num_ranks - 1)
                a.packed_recv_count[expert] = in_expert;
        }
        if (first == static_cast<int>(blockIdx.x))
            epTrace(g, kEpTraceDispatchReceive, kEpTraceMiddle);  // the first wait is over
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total = firsts[pairs - 1] + counts[pairs - 1];
    int p = 0;  // a warp's rows come in round order, so its pair only moves on
    for (int m = warp; m < total; m += kWarps) {
        while (m >= firsts[p] + counts[p])
            ++p;
        const int i = m - firsts[p];
        const int expert = expertOf(p);
        const int src = p % num_ranks;
        EpRowDest from;
        if (begins[p] & kEpFromSlot) {  // direct dispatch: a row in the slot named for the op
            const int64_t base =
                epSignalPayload(__ldcg(slot_view.bases + expert * num_ranks + src));
            from = epRowAfter(slot_view.first, expert * capacity + base + i, g.hidden);
        } else {
            from = epMessageDest(L, own + L.dispatchMessageOffset(phase, expert, src, i));
        }
        epUnpackRow(g, a, from, expert * capacity + (begins[p] & ~kEpFromSlot) + i, lane);
    }
    __syncthreads();  // `shared` is reused by the block's next round
}

// A dispatch receive block: packs local experts blockIdx.x, + gridDim.x, ...
// in rounds of epDispatchReceiveExpertsPerRound (all of them unless their
// pairs outgrow the shared memory), then finishes the operation. `shared`
// holds epDispatchReceiveSharedBytes(g, gridDim.x).
template <int kThreads, typename Wait>
__device__ void epDispatchReceiveBlock(const EpGroupArgs& g, const DispatchArgs& a, int* shared,
                                       Wait wait) {
    epTrace(g, kEpTraceDispatchReceive, kEpTraceStart);
    EpState* state = epState(g.local_buffer);
    const uint64_t seq = state->dispatch_seq + 1;
    const int nle = static_cast<int>(epLayoutOf(g).numLocalExperts());
    const int grid = static_cast<int>(gridDim.x);
    const int per_round = epDispatchReceiveExpertsPerRound(nle, g.num_ranks, grid);
    for (int first = blockIdx.x; first < nle; first += per_round * grid) {
        const int experts = min(per_round, (nle - 1 - first) / grid + 1);
        epDispatchReceiveRound<kThreads>(g, a, shared, first, experts, seq, wait);
    }
    epTrace(g, kEpTraceDispatchReceive, kEpTraceEnd);
    if (threadIdx.x == 0)
        epFinishOperation(&state->dispatch_done, &state->dispatch_seq, seq, &state->error_code,
                          g.error_mirror);
}

// The rows a combine send block returns to `dst`: count, clamped to what the
// handle can describe (begin and count are the receiver's words).
__device__ inline int64_t epCombineRowCount(const EpGroupArgs& g, const CombineArgs& a,
                                            int local_expert, int dst, int64_t* begin) {
    const int64_t capacity = static_cast<int64_t>(g.num_ranks) * g.max_tokens;
    const int64_t range = a.layout_range[static_cast<int64_t>(local_expert) * g.num_ranks + dst];
    *begin = epRangeBegin(range);
    int64_t count = epRangeCount(range);
    if (*begin > capacity)
        count = 0;
    return min(count, min(static_cast<int64_t>(g.max_tokens), capacity - *begin));
}

// The receiver's token of row `i` of those a combine send block returns
// (`begin` from epCombineRowCount), or -1 for a row the dispatch did not
// write; *x_row: its row of the expert output.
__device__ inline int epCombineRowToken(const EpGroupArgs& g, const CombineArgs& a,
                                        const EpSendBlock& b, int64_t begin, int64_t i,
                                        int64_t* x_row) {
    const int64_t capacity = static_cast<int64_t>(g.num_ranks) * g.max_tokens;
    *x_row = b.local_expert * capacity + begin + i;
    const int token = a.src_info[*x_row];
    return token >= 0 && token < g.max_tokens ? token : -1;
}

// Calls copy(i, x_row, token, lane) for each row a combine send block
// returns to b.dst, one warp per row (row i on warp i % warps): i counts the
// block's rows, x_row is the row of the expert output, token the receiver's
// token it belongs to. Rows the dispatch did not write are skipped. Returns
// the count the receiver is told (*begin_out: where the rows start); every
// thread of the block must call it.
template <int kThreads, typename Copy>
__device__ int64_t epForEachCombineRow(const EpGroupArgs& g, const CombineArgs& a,
                                       const EpSendBlock& b, Copy copy,
                                       int64_t* begin_out = nullptr) {
    int64_t begin = 0;
    const int64_t count = epCombineRowCount(g, a, b.local_expert, b.dst, &begin);
    if (begin_out)
        *begin_out = begin;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int64_t i = warp; i < count; i += kThreads / 32) {
        int64_t x_row = 0;
        const int token = epCombineRowToken(g, a, b, begin, i, &x_row);
        if (token >= 0)
            copy(i, x_row, token, lane);
    }
    return count;
}

// One warp copies BF16 row `x_row` of the expert output to `out`.
__device__ inline void epCopyExpertRow(const EpGroupArgs& g, const CombineArgs& a, int64_t x_row,
                                       void* out, int lane) {
    epWarpCopy16(
        static_cast<int4*>(out),
        reinterpret_cast<const int4*>(static_cast<const char*>(a.x) + x_row * g.hidden * 2),
        g.hidden / 8, lane, epLoadPlain);
}

// The states of a combine receive block's per-expert bytes.
enum EpCombineExpert : uint8_t {
    kEpCombineUnused = 0,   // no token of the block's so far selected it
    kEpCombineNeeded = 1,   // selected; its flag not yet waited for
    kEpCombineArrived = 2,  // its rows for this rank are in
    kEpCombineMissing = 3,  // its owner is inactive or timed out: adds nothing
};

// One round of a combine receive block: `tokens` of its tokens, first,
// first + gridDim.x, ... It marks the experts they selected that no earlier
// round waited for, waits for all those flags at once, one thread per expert
// with wait(owner, word_offset, seq) -> EpWait (a flag means every row of
// that expert for this rank is in), then reduces with all threads spread
// over the round's (token, 16-byte word) pairs, summing in FP32 in k order.
// Experts whose flag did not arrive and -1 entries add nothing. `state`
// holds num_experts bytes kept across rounds; `entries` tokens * top_k ints.
template <typename Wait>
__device__ void epCombineReceiveRound(const EpGroupArgs& g, const CombineArgs& a, int first,
                                      int tokens, uint64_t seq, uint8_t* state, int* entries,
                                      Wait wait) {
    const EpLayout L = epLayoutOf(g);
    const int top_k = a.top_k;
    const int nle = static_cast<int>(L.numLocalExperts());
    EpState* ep_state = epState(g.local_buffer);
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(g.local_buffer);
    const auto tokenOf = [&](int j) { return first + j * static_cast<int>(gridDim.x); };

    for (int i = threadIdx.x; i < tokens * top_k; i += blockDim.x) {
        const int64_t id = a.topk_idx[static_cast<int64_t>(tokenOf(i / top_k)) * top_k + i % top_k];
        if (id < -1 || id >= g.num_experts) {
            epReportError(&ep_state->error_code, &ep_state->error_info, kEpErrorBadExpertId,
                          static_cast<int32_t>(id));
            entries[i] = -1;
            continue;
        }
        entries[i] = static_cast<int>(id);
        if (id >= 0 && state[id] == kEpCombineUnused)
            state[id] = kEpCombineNeeded;  // racing threads store the same byte
    }
    __syncthreads();
    // A rank inactive in its own view sent nothing, so nothing comes back.
    const bool self_active = epLoadVolatile(&g.active_ranks[g.rank]) != 0;
    for (int e = threadIdx.x; e < g.num_experts; e += blockDim.x) {
        if (state[e] != kEpCombineNeeded)
            continue;
        const int owner = e / nle;
        const bool arrived = self_active && epLoadVolatile(&g.active_ranks[owner]) != 0 &&
                             wait(owner, L.combineFlagOffset(phase, e), seq) == EpWait::kArrived;
        state[e] = arrived ? kEpCombineArrived : kEpCombineMissing;
    }
    __syncthreads();
    if (first == static_cast<int>(blockIdx.x))
        epTrace(g, kEpTraceCombineReceive, kEpTraceMiddle);  // the first wait is over
    const int64_t words = g.hidden / 8;
    for (int64_t item = threadIdx.x; item < tokens * words; item += blockDim.x) {
        const int j = static_cast<int>(item / words);
        const int64_t c = item % words;
        const int token = tokenOf(j);
        const int* mine = entries + j * top_k;
        const float* weights = a.topk_weights + static_cast<int64_t>(token) * top_k;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        // A batch of the experts' rows is loaded before any is summed (see
        // kEpCopyBatch); the sum stays in k order.
        for (int k0 = 0; k0 < top_k; k0 += kEpCopyBatch) {
            int4 raw[kEpCopyBatch];
#pragma unroll
            for (int b = 0; b < kEpCopyBatch; ++b) {
                const int k = k0 + b;
                const int e = k < top_k ? mine[k] : -1;
                if (e >= 0 && state[e] == kEpCombineArrived) {
                    raw[b] = __ldcg(
                        reinterpret_cast<const int4*>(local + L.combineRowOffset(phase, e, token)) +
                        c);
                }
            }
#pragma unroll
            for (int b = 0; b < kEpCopyBatch; ++b) {
                const int k = k0 + b;
                const int e = k < top_k ? mine[k] : -1;
                if (e < 0 || state[e] != kEpCombineArrived)
                    continue;
                const float w = weights[k];
                const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&raw[b]);
                for (int q = 0; q < 4; ++q) {
                    acc[2 * q] = fmaf(w, __low2float(y[q]), acc[2 * q]);
                    acc[2 * q + 1] = fmaf(w, __high2float(y[q]), acc[2 * q + 1]);
                }
            }
        }
        int4 packed;
        __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&packed);
        for (int q = 0; q < 4; ++q)
            o[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
        reinterpret_cast<int4*>(static_cast<char*>(a.out) +
                                static_cast<int64_t>(token) * g.hidden * 2)[c] = packed;
    }
    __syncthreads();  // `entries` is reused by the next round
}

// A combine receive block: reduces tokens blockIdx.x, + gridDim.x, ... in
// rounds of epCombineReceiveTokensPerRound (see epCombineReceiveRound),
// then finishes the operation. The grid has at least one block even with no
// tokens. `shared` holds epCombineReceiveSharedBytes(g, a, gridDim.x).
template <typename Wait>
__device__ void epCombineReceiveBlock(const EpGroupArgs& g, const CombineArgs& a, void* shared,
                                      Wait wait) {
    epTrace(g, kEpTraceCombineReceive, kEpTraceStart);
    EpState* ep_state = epState(g.local_buffer);
    const uint64_t seq = ep_state->combine_seq + 1;
    uint8_t* state = static_cast<uint8_t*>(shared);
    int* entries = reinterpret_cast<int*>(state + epCombineReceiveStateBytes(g.num_experts));
    for (int e = threadIdx.x; e < g.num_experts; e += blockDim.x)
        state[e] = kEpCombineUnused;
    __syncthreads();
    const int grid = static_cast<int>(gridDim.x);
    const int per_round = epCombineReceiveTokensPerRound(a.num_tokens, a.top_k, grid);
    for (int first = blockIdx.x; first < a.num_tokens; first += per_round * grid) {
        const int tokens = min(per_round, (a.num_tokens - 1 - first) / grid + 1);
        epCombineReceiveRound(g, a, first, tokens, seq, state, entries, wait);
    }
    epTrace(g, kEpTraceCombineReceive, kEpTraceEnd);
    if (threadIdx.x == 0)
        epFinishOperation(&ep_state->combine_done, &ep_state->combine_seq, seq,
                          &ep_state->error_code, g.error_mirror);
}

}  // namespace mooncake::ep
