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

#include "mooncake-ep/kernels/ep_blocks.cuh"
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
    int64_t begin = 0;
    const int64_t count = epCombineRowCount(p.g, p.a, local_expert, dst, &begin);

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
    const char* local = static_cast<const char*>(p.g.local_buffer);
    epCombineReceiveBlock(p.g, p.a, shared, [&](int owner, int64_t word, uint64_t seq) {
        uint32_t unused = 0;
        return epWaitSignal(reinterpret_cast<const uint64_t*>(local + word), seq,
                            &p.g.active_ranks[owner], p.g.timeout_ns, &unused);
    });
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
