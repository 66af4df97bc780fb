// Combine: expert outputs go back to the ranks that own their tokens, and
// each owner reduces them: out[t] = sum_k w[t,k] * y_{topk_idx[t,k]}[t] in FP32.
//
//   send     one block per (local expert, destination rank): copies the rows
//            the dispatch handle says came from that rank into its combine
//            region at [global expert][source token], then signals that
//            expert's flag there.
//   receive  a block per token (fewer and larger when ranks share the GPU,
//            each then taking several): waits for the flags of all the
//            experts its tokens selected at once (deadline, active_ranks),
//            then reduces with its threads spread over all its tokens'
//            channels (epCombineReceiveBlock). Experts whose flag did not
//            arrive (rank inactive or timed out) and -1 entries add nothing.
//            When ranks share the GPU it is split (epSplitReceive): one
//            block spins until every flag is in, then a block per token
//            reduces.
#include <cuda_bf16.h>

#include <string>

#include "mooncake-ep/kernels/early_launch.cuh"
#include "mooncake-ep/kernels/ep_blocks.cuh"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

struct CombineParams {
    EpGroupArgs g;
    CombineArgs a;
};

template <int kSendThreads>
__global__ void __launch_bounds__(kSendThreads) combineSend(CombineParams p) {
    epTrace(p.g, kEpTraceCombineSend, kEpTraceStart);
    const EpLayout L = epLayoutOf(p.g);
    const EpSendBlock b = epCombineSendBlock(p.g, L);
    if (!b.active(p.g))
        return;
    char* remote = static_cast<char*>(p.g.peer_buffers[b.dst]);
    const int64_t count = epForEachCombineRow<kSendThreads>(
        p.g, p.a, b, [&](int64_t, int64_t x_row, int token, int lane) {
            epCopyExpertRow(p.g, p.a, x_row, remote + L.combineRowOffset(b.phase, b.expert, token),
                            lane);
        });
    __syncthreads();
    epTrace(p.g, kEpTraceCombineSend, kEpTraceMiddle);
    if (threadIdx.x == 0) {
        epSignal(reinterpret_cast<uint64_t*>(remote + L.combineFlagOffset(b.phase, b.expert)),
                 b.seq, static_cast<uint32_t>(count));
    }
    epTrace(p.g, kEpTraceCombineSend, kEpTraceEnd);
}

// kPeek: queued after combineReceiveWait, so every flag it waits for is in
// or given up on, and it reads them without spinning.
template <bool kPeek>
__global__ void __launch_bounds__(kEpCombineRecvMaxThreads) combineReceive(CombineParams p) {
    extern __shared__ int shared[];  // epCombineReceiveSharedBytes
    if (kPeek)
        epAwaitPrecedingGrid();
    const char* local = static_cast<const char*>(p.g.local_buffer);
    epCombineReceiveBlock(p.g, p.a, shared, [&](int owner, int64_t word, uint64_t seq) {
        uint32_t unused = 0;
        return epAwaitSignal<kPeek>(reinterpret_cast<const uint64_t*>(local + word), seq,
                                    &p.g.active_ranks[owner], p.g.timeout_ns, &unused);
    });
}

// The spinning half of a split receive (epSplitReceive): one block waits
// for the flag of every expert this rank's tokens selected, a thread per
// top-k entry (entries of one expert wait on one word), marking owners that
// time out inactive, and ends. Bad ids are the copy kernel's to report.
__global__ void __launch_bounds__(kEpReceiveWaitThreads) combineReceiveWait(CombineParams p) {
    const EpGroupArgs& g = p.g;
    const EpLayout L = epLayoutOf(g);
    const uint64_t seq = epState(g.local_buffer)->combine_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(g.local_buffer);
    if (epLoadVolatile(&g.active_ranks[g.rank]) == 0)
        return;  // it sent nothing, so nothing comes back
    const int64_t nle = L.numLocalExperts();
    const int64_t entries = static_cast<int64_t>(p.a.num_tokens) * p.a.top_k;
    for (int64_t i = threadIdx.x; i < entries; i += blockDim.x) {
        const int64_t id = p.a.topk_idx[i];
        if (id < 0 || id >= g.num_experts)
            continue;
        const int owner = static_cast<int>(id / nle);
        if (epLoadVolatile(&g.active_ranks[owner]) == 0)
            continue;
        uint32_t unused = 0;
        epWaitSignal(reinterpret_cast<const uint64_t*>(local + L.combineFlagOffset(phase, id)), seq,
                     &g.active_ranks[owner], g.timeout_ns, &unused);
    }
    // The block triggers at its first thread's call: the threads without a
    // pair would fire it at once, and the copy blocks would sit on the SMs
    // for the whole wait, starving peers' send kernels (session 48's 200 ms
    // deadline hits).
    __syncthreads();
    epLetDependentGridStart();
}

}  // namespace

Status launchCombine(const EpGroupArgs& g, const CombineArgs& a, cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkCombineArgs(g, a));
    const CombineParams p{g, a};
    const int nle = g.num_experts / g.num_ranks;
    const int blocks = nle * g.num_ranks;
    // The rows this rank returns are about the rows it was sent: with uniform
    // routing, as many as its own tokens' selections.
    epWithSendThreads(
        epSendThreads(static_cast<int64_t>(a.num_tokens) * a.top_k, blocks), [&](auto threads) {
            combineSend<decltype(threads)::value><<<blocks, threads.value, 0, stream>>>(p);
        });
    MC_RETURN_IF_ERROR(cudaLaunchStatus("combine send"));
    return launchCombineReceive(g, a, stream);
}

Status launchCombineReceive(const EpGroupArgs& g, const CombineArgs& a, cudaStream_t stream) {
    const CombineParams p{g, a};
    const bool split = epSplitReceive(g);
    const int blocks = epCombineReceiveGrid(g, a.num_tokens, split);
    const int threads = epCombineReceiveThreads(g, split);
    const size_t shared_bytes = epCombineReceiveSharedBytes(g, a, blocks);
    if (split) {
        combineReceiveWait<<<1, kEpReceiveWaitThreads, 0, stream>>>(p);
        MC_RETURN_IF_ERROR(cudaLaunchStatus("combine receive wait"));
        epLaunchAfterWaitKernel(combineReceive<true>, blocks, threads, shared_bytes, stream, p);
    } else {
        combineReceive<false><<<blocks, threads, shared_bytes, stream>>>(p);
    }
    return cudaLaunchStatus("combine receive");
}

}  // namespace mooncake::ep
