// Dispatch: every rank sends each of its tokens to the ranks owning the
// experts it selected, and each rank packs what it received per local expert.
//
// Two kernels, so no block ever waits on a block of its own grid:
//   send     token-major where it fits (dispatch_by_token.cu:
//            epDispatchSendByToken), else one block per global expert e (4
//            to 16 warps: epSendThreads): finds the tokens that selected e
//            (in token order, so slots are deterministic), writes their
//            messages into the owner's receive region, then one signal
//            carrying the count. Both give a token the same slot.
//   receive  a block per local expert (fewer when ranks share the GPU, each
//            then taking several: epDispatchReceiveGrid): waits for all its
//            experts' counts from every source at once (deadline,
//            active_ranks), writes the handle (src_info, layout_range),
//            then packs in source-rank order with all its warps spread over
//            all its messages (epDispatchReceiveBlock). When ranks share
//            the GPU it is split (epSplitReceive): one block spins until
//            every count is in, then a block per local expert packs.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>

#include "mooncake-ep/core/fp8_rule.h"
#include "mooncake-ep/core/handle.h"
#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/direct_dispatch.cuh"
#include "mooncake-ep/kernels/ep_blocks.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kRecvThreads = 512;

// The kernels' view of the arguments, by value.
struct DispatchParams {
    EpGroupArgs g;
    DispatchArgs a;
};

template <int kSendThreads>
__global__ void __launch_bounds__(kSendThreads) dispatchSend(DispatchParams p) {
    epTrace(p.g, kEpTraceDispatchSend, kEpTraceStart);
    const EpLayout L = epLayoutOf(p.g);
    const EpSendBlock b = epDispatchSendBlock(p.g, L);
    if (b.expert == 0)
        epCheckExpertIds(p.g, p.a, epState(p.g.local_buffer));
    if (!b.active(p.g))
        return;
    char* remote = static_cast<char*>(p.g.peer_buffers[b.dst]);
    const int sent =
        epForEachSelected<kSendThreads>(p.a, b.expert, [&](int slot, int token, int lane) {
            char* msg = remote + L.dispatchMessageOffset(b.phase, b.local_expert, p.g.rank, slot);
            epWriteMessage(p.g, p.a, L, token, msg, lane);
        });
    epTrace(p.g, kEpTraceDispatchSend, kEpTraceMiddle);
    if (threadIdx.x == 0) {
        epDirectPublishName(p.g, p.a, L, b.seq);  // before this block's count (same value)
        epSignal(reinterpret_cast<uint64_t*>(
                     remote + L.dispatchCountOffset(b.phase, b.local_expert, p.g.rank)),
                 b.seq, static_cast<uint32_t>(sent));
    }
    epTrace(p.g, kEpTraceDispatchSend, kEpTraceEnd);
}

// kPeek: queued after dispatchReceiveWait, so every count it waits for is
// in or given up on, and it reads them without spinning.
template <bool kPeek>
__global__ void __launch_bounds__(kRecvThreads, 2) dispatchReceive(DispatchParams p) {
    extern __shared__ int shared[];  // epDispatchReceiveSharedBytes
    const char* local = static_cast<const char*>(p.g.local_buffer);
    epDispatchReceiveBlock<kRecvThreads>(
        p.g, p.a, shared, [&](int src, int64_t word, uint64_t seq, uint32_t* count) {
            return epAwaitSignal<kPeek>(reinterpret_cast<const uint64_t*>(local + word), seq,
                                        &p.g.active_ranks[src], p.g.timeout_ns, count);
        });
}

// The spinning half of a split receive (epSplitReceive): one block waits
// for every (local expert, source) count of the op, marking sources that
// time out inactive, and ends.
__global__ void __launch_bounds__(kEpReceiveWaitThreads) dispatchReceiveWait(DispatchParams p) {
    const EpGroupArgs& g = p.g;
    const EpLayout L = epLayoutOf(g);
    const uint64_t seq = epState(g.local_buffer)->dispatch_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(g.local_buffer);
    if (epLoadVolatile(&g.active_ranks[g.rank]) == 0)
        return;  // nothing is sent to a rank inactive in its own view
    const int64_t pairs = L.numLocalExperts() * g.num_ranks;
    for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
        const int src = static_cast<int>(i % g.num_ranks);
        if (epLoadVolatile(&g.active_ranks[src]) == 0)
            continue;
        uint32_t count = 0;
        epWaitSignal(reinterpret_cast<const uint64_t*>(
                         local + L.dispatchCountOffset(phase, i / g.num_ranks, src)),
                     seq, &g.active_ranks[src], g.timeout_ns, &count);
    }
}

}  // namespace

Status launchDispatch(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkDispatchArgs(g, a));
    const DispatchParams p{g, a};
    if (epDispatchSendByToken(g, a)) {
        launchDispatchSendByToken(g, a, stream);
    } else {
        // A block per global expert; each of this rank's tokens goes to top_k.
        epWithSendThreads(
            epSendThreads(static_cast<int64_t>(a.num_tokens) * a.top_k, g.num_experts),
            [&](auto threads) {
                dispatchSend<decltype(threads)::value>
                    <<<g.num_experts, threads.value, 0, stream>>>(p);
            });
    }
    MC_RETURN_IF_ERROR(cudaLaunchStatus("dispatch send"));
    return launchDispatchReceive(g, a, stream);
}

Status launchDispatchReceive(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream) {
    const DispatchParams p{g, a};
    const bool split = epSplitReceive(g);
    const int grid = epDispatchReceiveGrid(g, split);
    const size_t shared_bytes = epDispatchReceiveSharedBytes(g, grid);
    if (split) {
        dispatchReceiveWait<<<1, kEpReceiveWaitThreads, 0, stream>>>(p);
        MC_RETURN_IF_ERROR(cudaLaunchStatus("dispatch receive wait"));
        dispatchReceive<true><<<grid, kRecvThreads, shared_bytes, stream>>>(p);
    } else {
        dispatchReceive<false><<<grid, kRecvThreads, shared_bytes, stream>>>(p);
    }
    return cudaLaunchStatus("dispatch receive");
}

}  // namespace mooncake::ep
