// Dispatch and combine over NCCL's device API, in the layout and with the
// outputs of the cuda_ipc kernels (kernels/dispatch.cu, kernels/combine.cu:
// the same block structure, slots, handles and sequence-number signals).
//
// Hybrid: a peer in this rank's LSA team has a window pointer in the peer
// table and is written with loads/stores, its signal word with a system-scope
// release store, exactly as over cuda_ipc. Any other peer is reached with GIN
// from the same window: the data goes to the send staging area (after the EP
// layout in the window), then one put per message run (dispatch) or row
// (combine), then a putValue of the signal word carrying a SignalAdd on the
// GIN signal of that word. NCCL makes a signal visible only after the
// payloads of that put and of the context's earlier puts to the same peer,
// so a receiver that sees the GIN signal reach `seq` may read the word and
// the data. The SignalAdd raises the signal to exactly `seq` (the sender
// remembers what it last signalled), because a rank may skip an operation
// for an inactive peer: signals then still read as "the last sequence sent".
#include <cuda_bf16.h>

#include "mooncake-ep/core/handle.h"
#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/message.cuh"
#include "mooncake-ep/nccl/nccl_device_args.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kSendThreads = 512;
constexpr int kSendWarps = kSendThreads / 32;
constexpr int kRecvThreads = 512;
constexpr int kRecvWarps = kRecvThreads / 32;
constexpr int kCombineRecvThreads = 256;

struct DispatchParams {
    NcclEpDevice d;
    EpGroupArgs g;
    DispatchArgs a;
};

struct CombineParams {
    NcclEpDevice d;
    EpGroupArgs g;
    CombineArgs a;
};

__device__ char* stagingPtr(const NcclEpDevice& d, int64_t offset) {
    return static_cast<char*>(ncclGetLocalPointer(d.window, d.staging_offset + offset));
}

// The signal id of the word at `word_offset` of half `phase`.
__device__ int signalId(const EpLayout& L, int phase, int64_t word_offset) {
    return static_cast<int>((word_offset - L.halfOffset(phase)) / 8);
}

// Sends the signal word over GIN and raises the receiver's GIN signal to `seq`.
__device__ void ginSignalWord(const NcclEpDevice& d, const EpLayout& L, int phase, int dst,
                              int64_t word_offset, uint64_t seq, uint32_t payload,
                              uint64_t* last_sent) {
    ncclGin gin(d.comm, dst);  // contexts spread over destinations
    const uint64_t delta = seq - *last_sent;
    *last_sent = seq;
    gin.putValue(
        ncclTeamWorld(d.comm), dst, d.window, static_cast<size_t>(word_offset),
        epMakeSignal(seq, payload),
        ncclGin_SignalAdd{static_cast<ncclGinSignal_t>(signalId(L, phase, word_offset)), delta});
    // The staging this block filled may be refilled by the next operation.
    gin.flush(ncclCoopThread());
}

// Waits until the GIN signal of a word reaches `seq`, then reads the word.
// Same contract as epWaitSignal (deadline, active_ranks).
__device__ EpWait waitGinWord(const NcclEpDevice& d, const EpLayout& L, int phase,
                              int64_t word_offset, const char* local, uint64_t seq, int src,
                              int32_t* peer_active, int64_t timeout_ns, uint32_t* payload) {
    ncclGin gin(d.comm, src);
    const ncclGinSignal_t id = static_cast<ncclGinSignal_t>(signalId(L, phase, word_offset));
    const uint64_t start = globalTimerNs();
    for (uint32_t spins = 0;; ++spins) {
        // Rolling comparison: the signal is at `seq` or one operation ahead.
        if (static_cast<int64_t>(gin.readSignal(id) - seq) >= 0) {
            const uint64_t v =
                loadAcquireSys(reinterpret_cast<const uint64_t*>(local + word_offset));
            if (epSignalMatches(v, seq)) {
                *payload = epSignalPayload(v);
                return EpWait::kArrived;
            }
        }
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

__global__ void __launch_bounds__(kSendThreads) ncclDispatchSend(DispatchParams p) {
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

    if (expert == 0) {
        for (int i = threadIdx.x; i < p.a.num_tokens * top_k; i += blockDim.x) {
            const int64_t id = p.a.topk_idx[i];
            if (id < -1 || id >= p.g.num_experts)
                epReportError(&state->error_code, &state->error_info, kEpErrorBadExpertId,
                              static_cast<int32_t>(id));
        }
    }
    if (epLoadVolatile(&p.g.active_ranks[dst]) == 0 ||
        epLoadVolatile(&p.g.active_ranks[p.g.rank]) == 0)
        return;
    char* lsa = static_cast<char*>(p.g.peer_buffers[dst]);  // null: reach it over GIN
    // Over GIN the messages of this expert are staged contiguously, as their
    // slots are at the receiver, so one put moves them all.
    const int64_t first_slot = L.dispatchMessageOffset(phase, local_expert, p.g.rank, 0);
    char* staged =
        stagingPtr(p.d, static_cast<int64_t>(expert) * p.g.max_tokens * L.messageBytes());

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
            char* msg = lsa ? lsa + first_slot + (sent + i) * L.messageBytes()
                            : staged + (sent + i) * L.messageBytes();
            epWriteMessage(p.g, p.a, L, chosen[i], msg, lane);
        }
        sent += chunk;
        __syncthreads();
    }
    const int64_t word = L.dispatchCountOffset(phase, local_expert, p.g.rank);
    if (threadIdx.x != 0)
        return;
    if (lsa) {
        epSignal(reinterpret_cast<uint64_t*>(lsa + word), seq, static_cast<uint32_t>(sent));
        return;
    }
    if (sent > 0) {
        __threadfence_system();  // the block's staged messages, before the NIC reads them
        ncclGin gin(p.d.comm, dst);
        gin.put(ncclTeamWorld(p.d.comm), dst, p.d.window, static_cast<size_t>(first_slot),
                p.d.window,
                static_cast<size_t>(p.d.staging_offset + static_cast<int64_t>(expert) *
                                                             p.g.max_tokens * L.messageBytes()),
                static_cast<size_t>(sent) * L.messageBytes());
    }
    ginSignalWord(p.d, L, phase, dst, word, seq, static_cast<uint32_t>(sent),
                  &p.d.last_sent[expert]);
}

__global__ void __launch_bounds__(kRecvThreads) ncclDispatchReceive(DispatchParams p) {
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

    const bool self_active = epLoadVolatile(&p.g.active_ranks[p.g.rank]) != 0;
    for (int src = threadIdx.x; src < num_ranks; src += blockDim.x) {
        uint32_t count = 0;
        if (self_active && epLoadVolatile(&p.g.active_ranks[src]) != 0) {
            const int64_t word = L.dispatchCountOffset(phase, local_expert, src);
            const EpWait w = p.g.peer_buffers[src] != nullptr
                                 ? epWaitSignal(reinterpret_cast<const uint64_t*>(local + word),
                                                seq, &p.g.active_ranks[src], p.g.timeout_ns, &count)
                                 : waitGinWord(p.d, L, phase, word, local, seq, src,
                                               &p.g.active_ranks[src], p.g.timeout_ns, &count);
            if (w != EpWait::kArrived)
                count = 0;
        }
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

__global__ void __launch_bounds__(kSendThreads) ncclCombineSend(CombineParams p) {
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
        return;
    char* lsa = static_cast<char*>(p.g.peer_buffers[dst]);

    const int64_t capacity = static_cast<int64_t>(num_ranks) * p.g.max_tokens;
    const int64_t range = p.a.layout_range[static_cast<int64_t>(local_expert) * num_ranks + dst];
    const int64_t begin = epRangeBegin(range);
    int64_t count = epRangeCount(range);
    if (begin > capacity)
        count = 0;
    count = min(count, min(static_cast<int64_t>(p.g.max_tokens), capacity - begin));

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t hidden = p.g.hidden;
    const int64_t row_bytes = hidden * 2;
    // Combine staging follows the dispatch staging: a row per (local expert,
    // destination, slot).
    const int64_t staging_base =
        static_cast<int64_t>(p.g.num_experts) * p.g.max_tokens * L.messageBytes() +
        (static_cast<int64_t>(local_expert) * num_ranks + dst) * p.g.max_tokens * row_bytes;
    for (int64_t i = warp; i < count; i += kSendWarps) {
        const int64_t row = local_expert * capacity + begin + i;
        const int token = p.a.src_info[row];
        if (token < 0 || token >= p.g.max_tokens)
            continue;
        const int4* src =
            reinterpret_cast<const int4*>(static_cast<const char*>(p.a.x) + row * row_bytes);
        const int64_t dst_offset = L.combineRowOffset(phase, expert, token);
        char* out_row = lsa ? lsa + dst_offset : stagingPtr(p.d, staging_base + i * row_bytes);
        int4* out = reinterpret_cast<int4*>(out_row);
        for (int64_t c = lane; c < hidden / 8; c += 32)
            out[c] = src[c];
        if (!lsa) {
            __syncwarp();
            if (lane == 0) {
                __threadfence_system();
                ncclGin gin(p.d.comm, dst);
                gin.put(ncclTeamWorld(p.d.comm), dst, p.d.window, static_cast<size_t>(dst_offset),
                        p.d.window,
                        static_cast<size_t>(p.d.staging_offset + staging_base + i * row_bytes),
                        static_cast<size_t>(row_bytes));
            }
        }
    }
    __syncthreads();  // every row's put is posted before the signal's
    if (threadIdx.x != 0)
        return;
    const int64_t word = L.combineFlagOffset(phase, expert);
    if (lsa) {
        epSignal(reinterpret_cast<uint64_t*>(lsa + word), seq, static_cast<uint32_t>(count));
        return;
    }
    ginSignalWord(p.d, L, phase, dst, word, seq, static_cast<uint32_t>(count),
                  &p.d.last_sent[p.g.num_experts + local_expert * num_ranks + dst]);
}

__global__ void __launch_bounds__(kCombineRecvThreads) ncclCombineReceive(CombineParams p) {
    extern __shared__ int shared[];  // experts[top_k], included[top_k]
    const EpLayout L = epLayoutOf(p.g);
    const int top_k = p.a.top_k;
    int* experts = shared;
    int* included = shared + top_k;
    const int token = blockIdx.x;
    const int nle = static_cast<int>(L.numLocalExperts());
    EpState* state = epState(p.g.local_buffer);
    const uint64_t seq = state->combine_seq + 1;
    const int phase = static_cast<int>(seq & 1);
    const char* local = static_cast<const char*>(p.g.local_buffer);

    const bool self_active = epLoadVolatile(&p.g.active_ranks[p.g.rank]) != 0;
    for (int k = threadIdx.x; k < top_k && token < p.a.num_tokens; k += blockDim.x) {
        const int64_t id = p.a.topk_idx[static_cast<int64_t>(token) * top_k + k];
        int use = 0;
        if (id < -1 || id >= p.g.num_experts) {
            epReportError(&state->error_code, &state->error_info, kEpErrorBadExpertId,
                          static_cast<int32_t>(id));
        } else if (id >= 0 && self_active) {
            const int owner = static_cast<int>(id / nle);
            int32_t* active = &p.g.active_ranks[owner];
            uint32_t unused = 0;
            if (epLoadVolatile(active) != 0) {
                const int64_t word = L.combineFlagOffset(phase, id);
                const EpWait w = p.g.peer_buffers[owner] != nullptr
                                     ? epWaitSignal(reinterpret_cast<const uint64_t*>(local + word),
                                                    seq, active, p.g.timeout_ns, &unused)
                                     : waitGinWord(p.d, L, phase, word, local, seq, owner, active,
                                                   p.g.timeout_ns, &unused);
                use = w == EpWait::kArrived;
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

__global__ void ncclPeerTable(NcclEpDevice d, int num_ranks, void** peers) {
    const ncclTeam world = ncclTeamWorld(d.comm);
    const ncclTeam lsa = ncclTeamLsa(d.comm);
    for (int r = threadIdx.x; r < num_ranks; r += blockDim.x)
        peers[r] =
            ncclTeamRankIsMember(lsa, world, r) ? ncclGetPeerPointer(d.window, 0, r) : nullptr;
}

}  // namespace

Status launchNcclPeerTable(const NcclEpDevice& d, int num_ranks, void** peers,
                           cudaStream_t stream) {
    ncclPeerTable<<<1, 128, 0, stream>>>(d, num_ranks, peers);
    return cudaLaunchStatus("NCCL peer table");
}

Status launchNcclDispatch(const NcclEpDevice& d, const EpGroupArgs& g, const DispatchArgs& a,
                          cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkDispatchArgs(g, a));
    const DispatchParams p{d, g, a};
    const int nle = g.num_experts / g.num_ranks;
    ncclDispatchSend<<<g.num_experts, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("NCCL dispatch send"));
    const size_t shared_bytes = 2 * sizeof(int) * static_cast<size_t>(g.num_ranks);
    ncclDispatchReceive<<<nle, kRecvThreads, shared_bytes, stream>>>(p);
    return cudaLaunchStatus("NCCL dispatch receive");
}

Status launchNcclCombine(const NcclEpDevice& d, const EpGroupArgs& g, const CombineArgs& a,
                         cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkCombineArgs(g, a));
    const CombineParams p{d, g, a};
    const int nle = g.num_experts / g.num_ranks;
    ncclCombineSend<<<nle * g.num_ranks, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("NCCL combine send"));
    const int blocks = a.num_tokens > 0 ? a.num_tokens : 1;
    const size_t shared_bytes = 2 * sizeof(int) * static_cast<size_t>(a.top_k);
    ncclCombineReceive<<<blocks, kCombineRecvThreads, shared_bytes, stream>>>(p);
    return cudaLaunchStatus("NCCL combine receive");
}

}  // namespace mooncake::ep
