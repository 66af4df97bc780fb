// The parts of the dispatch/combine kernels that do not depend on how bytes
// reach a peer: finding the tokens of an expert, packing what arrived, and
// the weighted reduction. The cuda_ipc kernels (dispatch.cu, combine.cu) and
// the NCCL device-API kernels (mooncake-ep/nccl) differ only in how they
// write to a peer and how they wait for a signal word, which they pass in.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "mooncake-ep/core/handle.h"
#include "mooncake-ep/kernels/device_sync.cuh"
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
        bool selected = false;
        if (token < a.num_tokens) {
            for (int k = 0; k < a.top_k && !selected; ++k)
                selected = a.topk_idx[static_cast<int64_t>(token) * a.top_k + k] == expert;
        }
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

// Packs what arrived for one local expert: waits for every source's count
// with wait(src, word_offset, seq, &count) -> EpWait, then packs in
// source-rank order and writes the expert's part of the handle. `shared`
// holds 2 * num_ranks ints; every thread of the block must call it.
template <int kThreads, typename Wait>
__device__ void epDispatchReceiveExpert(const EpGroupArgs& g, const DispatchArgs& a, int* shared,
                                        int local_expert, uint64_t seq, Wait wait) {
    constexpr int kWarps = kThreads / 32;
    const EpLayout L = epLayoutOf(g);
    const int num_ranks = g.num_ranks;
    int* counts = shared;
    int* begins = shared + num_ranks;
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(g.local_buffer);

    // A rank inactive in its own view receives nothing (no peer sends to it).
    const bool self_active = epLoadVolatile(&g.active_ranks[g.rank]) != 0;
    for (int src = threadIdx.x; src < num_ranks; src += blockDim.x) {
        uint32_t count = 0;
        if (self_active && epLoadVolatile(&g.active_ranks[src]) != 0) {
            if (wait(src, L.dispatchCountOffset(phase, local_expert, src), seq, &count) !=
                EpWait::kArrived)
                count = 0;  // the rank is out: its messages, if any, are ignored
        }
        // A count is the peer's word: never trust it past the region.
        counts[src] = static_cast<int>(min(count, static_cast<uint32_t>(g.max_tokens)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int src = 0; src < num_ranks; ++src) {
            begins[src] = total;
            a.layout_range[static_cast<int64_t>(local_expert) * num_ranks + src] =
                epEncodeRange(total, counts[src]);
            total += counts[src];
        }
        a.packed_recv_count[local_expert] = total;
        if (local_expert == static_cast<int>(blockIdx.x))
            epTrace(g, kEpTraceDispatchReceive, kEpTraceMiddle);
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t capacity = static_cast<int64_t>(num_ranks) * g.max_tokens;
    for (int src = 0; src < num_ranks; ++src) {
        for (int i = warp; i < counts[src]; i += kWarps) {
            const char* msg = local + L.dispatchMessageOffset(phase, local_expert, src, i);
            epUnpackMessage(g, a, L, msg, local_expert * capacity + begins[src] + i, lane);
        }
    }
    __syncthreads();  // `shared` is reused for the block's next expert
}

// A dispatch receive block: packs local experts blockIdx.x, + gridDim.x, ...
// (epDispatchReceiveExpert), then finishes the operation.
template <int kThreads, typename Wait>
__device__ void epDispatchReceiveBlock(const EpGroupArgs& g, const DispatchArgs& a, int* shared,
                                       Wait wait) {
    epTrace(g, kEpTraceDispatchReceive, kEpTraceStart);
    EpState* state = epState(g.local_buffer);
    const uint64_t seq = state->dispatch_seq + 1;
    const int nle = static_cast<int>(epLayoutOf(g).numLocalExperts());
    for (int local_expert = blockIdx.x; local_expert < nle; local_expert += gridDim.x)
        epDispatchReceiveExpert<kThreads>(g, a, shared, local_expert, seq, wait);
    epTrace(g, kEpTraceDispatchReceive, kEpTraceEnd);
    if (threadIdx.x == 0)
        epFinishOperation(&state->dispatch_done, &state->dispatch_seq, seq);
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

// Reduces token `token` for a combine receive block: waits for the flags of
// the experts it selected with wait(owner, word_offset, seq) -> EpWait, then
// sums in FP32. Experts whose flag did not arrive and -1 entries add nothing.
// `seq` is the operation's, read once by the block at its start (the grid's
// last block advances EpState's copy). `experts` and `included` hold top_k
// ints of shared memory; every thread of the block must call it.
template <typename Wait>
__device__ void epCombineReceiveToken(const EpGroupArgs& g, const CombineArgs& a, int token,
                                      uint64_t seq, int* experts, int* included, Wait wait) {
    const EpLayout L = epLayoutOf(g);
    const int top_k = a.top_k;
    const int nle = static_cast<int>(L.numLocalExperts());
    EpState* state = epState(g.local_buffer);
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(g.local_buffer);

    // A rank inactive in its own view sent nothing, so nothing comes back.
    const bool self_active = epLoadVolatile(&g.active_ranks[g.rank]) != 0;
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
        const int64_t id = a.topk_idx[static_cast<int64_t>(token) * top_k + k];
        int use = 0;
        if (id < -1 || id >= g.num_experts) {
            epReportError(&state->error_code, &state->error_info, kEpErrorBadExpertId,
                          static_cast<int32_t>(id));
        } else if (id >= 0 && self_active) {
            const int owner = static_cast<int>(id / nle);
            if (epLoadVolatile(&g.active_ranks[owner]) != 0)
                use = wait(owner, L.combineFlagOffset(phase, id), seq) == EpWait::kArrived;
        }
        experts[k] = static_cast<int>(id);
        included[k] = use;
    }
    __syncthreads();
    if (token == static_cast<int>(blockIdx.x))
        epTrace(g, kEpTraceCombineReceive, kEpTraceMiddle);
    const int64_t hidden = g.hidden;
    const float* weights = a.topk_weights + static_cast<int64_t>(token) * top_k;
    int4* out = reinterpret_cast<int4*>(static_cast<char*>(a.out) + token * hidden * 2);
    for (int64_t c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        // A batch of the experts' rows is loaded before any is summed (see
        // kEpCopyBatch); the sum stays in k order.
        for (int first = 0; first < top_k; first += kEpCopyBatch) {
            int4 raw[kEpCopyBatch];
#pragma unroll
            for (int b = 0; b < kEpCopyBatch; ++b) {
                const int k = first + b;
                if (k < top_k && included[k]) {
                    raw[b] = __ldcg(reinterpret_cast<const int4*>(
                                        local + L.combineRowOffset(phase, experts[k], token)) +
                                    c);
                }
            }
#pragma unroll
            for (int b = 0; b < kEpCopyBatch; ++b) {
                const int k = first + b;
                if (k >= top_k || !included[k])
                    continue;
                const float w = weights[k];
                const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&raw[b]);
                for (int j = 0; j < 4; ++j) {
                    acc[2 * j] = fmaf(w, __low2float(y[j]), acc[2 * j]);
                    acc[2 * j + 1] = fmaf(w, __high2float(y[j]), acc[2 * j + 1]);
                }
            }
        }
        int4 packed;
        __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&packed);
        for (int j = 0; j < 4; ++j)
            o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
        out[c] = packed;
    }
    __syncthreads();  // `experts` and `included` are reused by the next token
}

// A combine receive block: reduces tokens blockIdx.x, + gridDim.x, ... (see
// epCombineReceiveToken), then finishes the operation. The grid has at
// least one block even with no tokens. `shared` holds 2 * top_k ints.
template <typename Wait>
__device__ void epCombineReceiveBlock(const EpGroupArgs& g, const CombineArgs& a, int* shared,
                                      Wait wait) {
    epTrace(g, kEpTraceCombineReceive, kEpTraceStart);
    EpState* state = epState(g.local_buffer);
    const uint64_t seq = state->combine_seq + 1;
    for (int token = blockIdx.x; token < a.num_tokens; token += gridDim.x)
        epCombineReceiveToken(g, a, token, seq, shared, shared + a.top_k, wait);
    epTrace(g, kEpTraceCombineReceive, kEpTraceEnd);
    if (threadIdx.x == 0)
        epFinishOperation(&state->combine_done, &state->combine_seq, seq);
}

}  // namespace mooncake::ep
