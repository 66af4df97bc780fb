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

// One warp writes one token's message: header, then BF16 or FP8 + scales.
__device__ void writeMessage(const DispatchParams& p, const EpLayout& L, int token, char* msg,
                             int lane) {
    if (lane == 0)
        *reinterpret_cast<int4*>(msg) = make_int4(token, 0, 0, 0);
    const int64_t hidden = p.g.hidden;
    const char* row = static_cast<const char*>(p.a.x) + static_cast<int64_t>(token) * hidden * 2;
    char* payload = msg + kEpMessageHeaderBytes;
    if (!p.a.use_fp8) {
        const int4* src = reinterpret_cast<const int4*>(row);
        int4* dst = reinterpret_cast<int4*>(payload);
        for (int64_t i = lane; i < hidden / 8; i += 32)
            dst[i] = src[i];
        return;
    }
    float* scales = reinterpret_cast<float*>(msg + L.fp8ScaleOffset());
    for (int64_t group = 0; group < hidden / kEpFp8GroupSize; ++group) {
        // Each lane holds 4 of the group's 128 channels.
        const int64_t c = group * kEpFp8GroupSize + lane * 4;
        const uint2 raw = *reinterpret_cast<const uint2*>(row + c * 2);
        const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
        const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
        const float v[4] = {__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi)};
        float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
        for (int off = 16; off > 0; off >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        amax = fmaxf(amax, kEpFp8AmaxFloor);
        const float inv = kEpFp8Max / amax;
        const __nv_fp8x2_storage_t q01 = __nv_cvt_float2_to_fp8x2(
            make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE, __NV_E4M3);
        const __nv_fp8x2_storage_t q23 = __nv_cvt_float2_to_fp8x2(
            make_float2(v[2] * inv, v[3] * inv), __NV_SATFINITE, __NV_E4M3);
        *reinterpret_cast<uint32_t*>(payload + c) =
            static_cast<uint32_t>(q01) | (static_cast<uint32_t>(q23) << 16);
        if (lane == 0)
            scales[group] = amax / kEpFp8Max;
    }
}

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
            writeMessage(p, L, chosen[i], msg, lane);
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

// Copies one received message (one warp) into packed row `row` of its expert.
__device__ void unpackMessage(const DispatchParams& p, const EpLayout& L, const char* msg,
                              int64_t row, int lane) {
    const int64_t hidden = p.g.hidden;
    if (lane == 0)
        p.a.src_info[row] = __ldcg(reinterpret_cast<const int*>(msg));
    const char* payload = msg + kEpMessageHeaderBytes;
    const int64_t data_bytes = p.a.use_fp8 ? hidden : 2 * hidden;
    const int4* src = reinterpret_cast<const int4*>(payload);
    int4* dst = reinterpret_cast<int4*>(static_cast<char*>(p.a.packed_recv_x) + row * data_bytes);
    for (int64_t i = lane; i < data_bytes / 16; i += 32)
        dst[i] = __ldcg(src + i);
    if (p.a.use_fp8) {
        const int64_t groups = hidden / kEpFp8GroupSize;
        const float* scales = reinterpret_cast<const float*>(msg + L.fp8ScaleOffset());
        for (int64_t i = lane; i < groups; i += 32)
            p.a.packed_recv_scales[row * groups + i] = __ldcg(scales + i);
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
            unpackMessage(p, L, msg, local_expert * capacity + begins[src] + i, lane);
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
