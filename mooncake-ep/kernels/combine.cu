// Combine: expert outputs go back to the ranks that own their tokens, and
// each owner reduces them: out[t] = sum_k w[t,k] * y_{topk_idx[t,k]}[t] in FP32.
//
//   send     one block per (local expert, destination rank): copies the rows
//            the dispatch handle says came from that rank into its combine
//            region at [global expert][source token], then signals that
//            expert's flag there.
//   receive  one block per token: waits for the flags of the experts the
//            token selected (deadline, active_ranks), then reduces. Experts
//            whose flag did not arrive (rank inactive or timed out) and -1
//            entries add nothing.
#include <cuda_bf16.h>

#include <string>

#include "mooncake-ep/core/handle.h"
#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kSendThreads = 512;
constexpr int kSendWarps = kSendThreads / 32;
constexpr int kRecvThreads = 256;

struct CombineParams {
    EpGroupArgs g;
    CombineArgs a;
};

__global__ void __launch_bounds__(kSendThreads) combineSend(CombineParams p) {
    const EpLayout L = epLayoutOf(p.g);
    const int num_ranks = p.g.num_ranks;
    const int local_expert = blockIdx.x / num_ranks;
    const int dst = blockIdx.x % num_ranks;
    const int nle = static_cast<int>(L.numLocalExperts());
    const int expert = p.g.rank * nle + local_expert;
    EpState* state = epState(p.g.local_buffer);
    const uint64_t seq = state->combine_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    if (epLoadVolatile(&p.g.active_ranks[dst]) == 0 ||
        epLoadVolatile(&p.g.active_ranks[p.g.rank]) == 0)
        return;  // as in dispatch: an inactive rank (in either view) gets nothing
    char* remote = static_cast<char*>(p.g.peer_buffers[dst]);

    const int64_t capacity = static_cast<int64_t>(num_ranks) * p.g.max_tokens;
    const int64_t range = p.a.layout_range[static_cast<int64_t>(local_expert) * num_ranks + dst];
    const int64_t begin = epRangeBegin(range);
    int64_t count = epRangeCount(range);
    if (begin > capacity)
        count = 0;
    count = min(count, min(static_cast<int64_t>(p.g.max_tokens), capacity - begin));

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t hidden = p.g.hidden;
    for (int64_t i = warp; i < count; i += kSendWarps) {
        const int64_t row = local_expert * capacity + begin + i;
        const int token = p.a.src_info[row];
        if (token < 0 || token >= p.g.max_tokens)
            continue;  // not a row the dispatch wrote
        const int4* src =
            reinterpret_cast<const int4*>(static_cast<const char*>(p.a.x) + row * hidden * 2);
        int4* out = reinterpret_cast<int4*>(remote + L.combineRowOffset(phase, expert, token));
        for (int64_t c = lane; c < hidden / 8; c += 32)
            out[c] = src[c];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        epSignal(reinterpret_cast<uint64_t*>(remote + L.combineFlagOffset(phase, expert)), seq,
                 static_cast<uint32_t>(count));
    }
}

__global__ void __launch_bounds__(kRecvThreads) combineReceive(CombineParams p) {
    extern __shared__ int shared[];  // experts[top_k], included[top_k]
    const EpLayout L = epLayoutOf(p.g);
    const int top_k = p.a.top_k;
    int* experts = shared;
    int* included = shared + top_k;
    const int token = blockIdx.x;  // the grid has one block even with no tokens
    const int nle = static_cast<int>(L.numLocalExperts());
    EpState* state = epState(p.g.local_buffer);
    const uint64_t seq = state->combine_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(p.g.local_buffer);

    // A rank inactive in its own view sent nothing, so nothing comes back.
    const bool self_active = epLoadVolatile(&p.g.active_ranks[p.g.rank]) != 0;
    for (int k = threadIdx.x; k < top_k && token < p.a.num_tokens; k += blockDim.x) {
        const int64_t id = p.a.topk_idx[static_cast<int64_t>(token) * top_k + k];
        int use = 0;
        if (id < -1 || id >= p.g.num_experts) {
            epReportError(&state->error_code, &state->error_info, kEpErrorBadExpertId,
                          static_cast<int32_t>(id));
        } else if (id >= 0 && self_active) {
            int32_t* active = &p.g.active_ranks[id / nle];
            uint32_t unused = 0;
            if (epLoadVolatile(active) != 0) {
                const uint64_t* word =
                    reinterpret_cast<const uint64_t*>(local + L.combineFlagOffset(phase, id));
                use = epWaitSignal(word, seq, active, p.g.timeout_ns, &unused) == EpWait::kArrived;
            }
        }
        experts[k] = static_cast<int>(id);
        included[k] = use;
    }
    __syncthreads();
    if (token < p.a.num_tokens) {
        const int64_t hidden = p.g.hidden;
        const float* weights = p.a.topk_weights + static_cast<int64_t>(token) * top_k;
        int4* out = reinterpret_cast<int4*>(static_cast<char*>(p.a.out) + token * hidden * 2);
        for (int64_t c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int k = 0; k < top_k; ++k) {
                if (!included[k])
                    continue;
                const float w = weights[k];
                const int4 raw = __ldcg(reinterpret_cast<const int4*>(
                                            local + L.combineRowOffset(phase, experts[k], token)) +
                                        c);
                const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&raw);
                for (int j = 0; j < 4; ++j) {
                    acc[2 * j] = fmaf(w, __low2float(y[j]), acc[2 * j]);
                    acc[2 * j + 1] = fmaf(w, __high2float(y[j]), acc[2 * j + 1]);
                }
            }
            int4 packed;
            __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&packed);
            for (int j = 0; j < 4; ++j)
                o[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
            out[c] = packed;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0)
        epFinishOperation(&state->combine_done, &state->combine_seq, seq);
}

}  // namespace

Status launchCombine(const EpGroupArgs& g, const CombineArgs& a, cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkCombineArgs(g, a));
    const CombineParams p{g, a};
    const int nle = g.num_experts / g.num_ranks;
    combineSend<<<nle * g.num_ranks, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("combine send"));
    const int blocks = a.num_tokens > 0 ? a.num_tokens : 1;
    const size_t shared_bytes = 2 * sizeof(int) * static_cast<size_t>(a.top_k);
    combineReceive<<<blocks, kRecvThreads, shared_bytes, stream>>>(p);
    return cudaLaunchStatus("combine receive");
}

}  // namespace mooncake::ep
