// Dispatch: every rank sends each of its tokens to the ranks owning the
// experts it selected, and each rank packs what it received per local expert.
//
// Two kernels, so no block ever waits on a block of its own grid:
//   send     one block per global expert e: finds the tokens that selected e
//            (in token order, so slots are deterministic), writes their
//            messages into the owner's receive region, then one signal
//            carrying the count.
//   receive  one block per local expert: waits for every source rank's
//            count (deadline, active_ranks), then packs in source-rank order
//            and writes the handle (src_info, layout_range).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <string>

#include "mooncake-ep/core/fp8_rule.h"
#include "mooncake-ep/core/handle.h"
#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-ep/kernels/message.cuh"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kSendThreads = 512;
constexpr int kSendWarps = kSendThreads / 32;
constexpr int kRecvThreads = 512;
constexpr int kRecvWarps = kRecvThreads / 32;

// The kernels' view of the arguments, by value.
struct DispatchParams {
    EpGroupArgs g;
    DispatchArgs a;
};

__global__ void __launch_bounds__(kSendThreads) dispatchSend(DispatchParams p) {
    const EpLayout L = epLayoutOf(p.g);
    const int expert = blockIdx.x;
    const int nle = static_cast<int>(L.numLocalExperts());
    const int dst = expert / nle;
    const int local_expert = expert % nle;
    EpState* state = epState(p.g.local_buffer);
    const uint64_t seq = state->dispatch_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int top_k = p.a.top_k;

    if (expert == 0) {  // one block reports ids outside [-1, num_experts)
        for (int i = threadIdx.x; i < p.a.num_tokens * top_k; i += blockDim.x) {
            const int64_t id = p.a.topk_idx[i];
            if (id < -1 || id >= p.g.num_experts)
                epReportError(&state->error_code, &state->error_info, kEpErrorBadExpertId,
                              static_cast<int32_t>(id));
        }
    }
    // Nothing to an inactive rank, not even its signal; a rank inactive in its
    // own view sends nothing at all (as the fallback does).
    if (epLoadVolatile(&p.g.active_ranks[dst]) == 0 ||
        epLoadVolatile(&p.g.active_ranks[p.g.rank]) == 0)
        return;
    char* remote = static_cast<char*>(p.g.peer_buffers[dst]);

    __shared__ int warp_counts[kSendWarps];
    __shared__ int chosen[kSendThreads];
    int sent = 0;
    for (int first = 0; first < p.a.num_tokens; first += kSendThreads) {
        const int token = first + threadIdx.x;
        bool selected = false;
        if (token < p.a.num_tokens) {
            for (int k = 0; k < top_k && !selected; ++k)
                selected = p.a.topk_idx[static_cast<int64_t>(token) * top_k + k] == expert;
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, selected);
        if (lane == 0)
            warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, chunk = 0;
        for (int w = 0; w < kSendWarps; ++w) {
            before += w < warp ? warp_counts[w] : 0;
            chunk += warp_counts[w];
        }
        if (selected)
            chosen[before + __popc(ballot & ((1u << lane) - 1))] = token;
        __syncthreads();
        for (int i = warp; i < chunk; i += kSendWarps) {
            char* msg = remote + L.dispatchMessageOffset(phase, local_expert, p.g.rank, sent + i);
            epWriteMessage(p.g, p.a, L, chosen[i], msg, lane);
        }
        sent += chunk;
        __syncthreads();  // `chosen` and `warp_counts` are reused
    }
    if (threadIdx.x == 0) {
        epSignal(reinterpret_cast<uint64_t*>(remote +
                                             L.dispatchCountOffset(phase, local_expert, p.g.rank)),
                 seq, static_cast<uint32_t>(sent));
    }
}

__global__ void __launch_bounds__(kRecvThreads) dispatchReceive(DispatchParams p) {
    extern __shared__ int shared[];  // counts[num_ranks], begins[num_ranks]
    const EpLayout L = epLayoutOf(p.g);
    const int num_ranks = p.g.num_ranks;
    int* counts = shared;
    int* begins = shared + num_ranks;
    const int local_expert = blockIdx.x;
    EpState* state = epState(p.g.local_buffer);
    const uint64_t seq = state->dispatch_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    char* local = static_cast<char*>(p.g.local_buffer);

    // A rank inactive in its own view receives nothing (no peer sends to it).
    const bool self_active = epLoadVolatile(&p.g.active_ranks[p.g.rank]) != 0;
    for (int src = threadIdx.x; src < num_ranks; src += blockDim.x) {
        uint32_t count = 0;
        if (self_active && epLoadVolatile(&p.g.active_ranks[src]) != 0) {
            const uint64_t* word = reinterpret_cast<const uint64_t*>(
                local + L.dispatchCountOffset(phase, local_expert, src));
            if (epWaitSignal(word, seq, &p.g.active_ranks[src], p.g.timeout_ns, &count) !=
                EpWait::kArrived)
                count = 0;  // the rank is out: its messages, if any, are ignored
        }
        // A count is the peer's word: never trust it past the region.
        counts[src] = static_cast<int>(min(count, static_cast<uint32_t>(p.g.max_tokens)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int src = 0; src < num_ranks; ++src) {
            begins[src] = total;
            p.a.layout_range[static_cast<int64_t>(local_expert) * num_ranks + src] =
                epEncodeRange(total, counts[src]);
            total += counts[src];
        }
        p.a.packed_recv_count[local_expert] = total;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t capacity = static_cast<int64_t>(num_ranks) * p.g.max_tokens;
    for (int src = 0; src < num_ranks; ++src) {
        for (int i = warp; i < counts[src]; i += kRecvWarps) {
            const char* msg = local + L.dispatchMessageOffset(phase, local_expert, src, i);
            epUnpackMessage(p.g, p.a, L, msg, local_expert * capacity + begins[src] + i, lane);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0)
        epFinishOperation(&state->dispatch_done, &state->dispatch_seq, seq);
}

}  // namespace

Status launchDispatch(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkDispatchArgs(g, a));
    const DispatchParams p{g, a};
    const int nle = g.num_experts / g.num_ranks;
    dispatchSend<<<g.num_experts, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("dispatch send"));
    const size_t shared_bytes = 2 * sizeof(int) * static_cast<size_t>(g.num_ranks);
    dispatchReceive<<<nle, kRecvThreads, shared_bytes, stream>>>(p);
    return cudaLaunchStatus("dispatch receive");
}

}  // namespace mooncake::ep
