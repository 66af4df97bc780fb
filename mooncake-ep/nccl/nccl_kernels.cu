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
#include "mooncake-ep/kernels/ep_blocks.cuh"
#include "mooncake-ep/nccl/nccl_device_args.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kSendThreads = 512;
constexpr int kRecvThreads = 512;

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

// The GIN context of traffic to `peer`: contexts are spread over peers, and
// data and signal to one peer use the same one, which NCCL's signal ordering
// needs. Reduced here rather than relying on how a given NCCL release maps an
// index past the context count.
__device__ int ginContext(const NcclEpDevice& d, int peer) {
    // Called on GIN paths only, where the count is at least 1.
    return d.comm.ginContextCount > 1 ? peer % d.comm.ginContextCount : 0;
}

// The signal id of the word at `word_offset` of half `phase`.
__device__ int signalId(const EpLayout& L, int phase, int64_t word_offset) {
    return static_cast<int>((word_offset - L.halfOffset(phase)) / 8);
}

// Sends the signal word over GIN and raises the receiver's GIN signal to `seq`.
__device__ void ginSignalWord(const NcclEpDevice& d, const EpLayout& L, int phase, int dst,
                              int64_t word_offset, uint64_t seq, uint32_t payload,
                              uint64_t* last_sent) {
    ncclGin gin(d.comm, ginContext(d, dst));
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
                              int64_t word_offset, const char* local, uint64_t seq, int self,
                              int32_t* peer_active, int64_t timeout_ns, uint32_t* payload) {
    // The sender picked the context from the destination's rank (this rank):
    // the signal lives in that context.
    ncclGin gin(d.comm, ginContext(d, self));
    const ncclGinSignal_t id = static_cast<ncclGinSignal_t>(signalId(L, phase, word_offset));
    return epWaitFor(peer_active, timeout_ns, payload, [&](uint32_t* out) {
        // Rolling comparison: the signal is at `seq` or one operation ahead.
        if (static_cast<int64_t>(gin.readSignal(id) - seq) < 0)
            return false;
        const uint64_t v = loadAcquireSys(reinterpret_cast<const uint64_t*>(local + word_offset));
        if (!epSignalMatches(v, seq))
            return false;
        *out = epSignalPayload(v);
        return true;
    });
}

// Waits for the signal word at `word` from `src`: a store over NVLink (LSA
// peer) or a GIN putValue.
__device__ EpWait waitWord(const NcclEpDevice& d, const EpGroupArgs& g, int src, int64_t word,
                           uint64_t seq, uint32_t* payload) {
    const char* local = static_cast<const char*>(g.local_buffer);
    if (g.peer_buffers[src] != nullptr)
        return epWaitSignal(reinterpret_cast<const uint64_t*>(local + word), seq,
                            &g.active_ranks[src], g.timeout_ns, payload);
    const EpLayout L = epLayoutOf(g);
    const int phase = static_cast<int>(seq & 1);
    return waitGinWord(d, L, phase, word, local, seq, g.rank, &g.active_ranks[src], g.timeout_ns,
                       payload);
}

__global__ void __launch_bounds__(kSendThreads) ncclDispatchSend(DispatchParams p) {
    const EpLayout L = epLayoutOf(p.g);
    const EpSendBlock b = epDispatchSendBlock(p.g, L);
    if (b.expert == 0)
        epCheckExpertIds(p.g, p.a, epState(p.g.local_buffer));
    if (!b.active(p.g))
        return;
    char* lsa = static_cast<char*>(p.g.peer_buffers[b.dst]);  // null: reach it over GIN
    // Over GIN the messages of this expert are staged contiguously, as their
    // slots are at the receiver, so one put moves them all.
    const int64_t first_slot = L.dispatchMessageOffset(b.phase, b.local_expert, p.g.rank, 0);
    const int64_t staging = static_cast<int64_t>(b.expert) * p.g.max_tokens * L.messageBytes();
    char* staged = stagingPtr(p.d, staging);
    const int sent =
        epForEachSelected<kSendThreads>(p.a, b.expert, [&](int slot, int token, int lane) {
            char* msg = (lsa ? lsa + first_slot : staged) + slot * L.messageBytes();
            epWriteMessage(p.g, p.a, L, token, msg, lane);
        });
    const int64_t word = L.dispatchCountOffset(b.phase, b.local_expert, p.g.rank);
    if (threadIdx.x != 0)
        return;
    if (lsa) {
        epSignal(reinterpret_cast<uint64_t*>(lsa + word), b.seq, static_cast<uint32_t>(sent));
        return;
    }
    if (sent > 0) {
        __threadfence_system();  // the block's staged messages, before the NIC reads them
        ncclGin gin(p.d.comm, ginContext(p.d, b.dst));
        gin.put(ncclTeamWorld(p.d.comm), b.dst, p.d.window, static_cast<size_t>(first_slot),
                p.d.window, static_cast<size_t>(p.d.staging_offset + staging),
                static_cast<size_t>(sent) * L.messageBytes());
    }
    ginSignalWord(p.d, L, b.phase, b.dst, word, b.seq, static_cast<uint32_t>(sent),
                  &p.d.last_sent[b.expert]);
}

__global__ void __launch_bounds__(kRecvThreads) ncclDispatchReceive(DispatchParams p) {
    extern __shared__ int shared[];  // epDispatchReceiveSharedBytes
    epDispatchReceiveBlock<kRecvThreads>(p.g, p.a, shared,
                                         [&](int src, int64_t word, uint64_t seq, uint32_t* count) {
                                             return waitWord(p.d, p.g, src, word, seq, count);
                                         });
}

__global__ void __launch_bounds__(kSendThreads) ncclCombineSend(CombineParams p) {
    const EpLayout L = epLayoutOf(p.g);
    const EpSendBlock b = epCombineSendBlock(p.g, L);
    if (!b.active(p.g))
        return;
    const int num_ranks = p.g.num_ranks;
    char* lsa = static_cast<char*>(p.g.peer_buffers[b.dst]);
    const int64_t row_bytes = p.g.hidden * 2;
    // Combine staging follows the dispatch staging: a row per (local expert,
    // destination, slot).
    const int64_t staging_base =
        static_cast<int64_t>(p.g.num_experts) * p.g.max_tokens * L.messageBytes() +
        (static_cast<int64_t>(b.local_expert) * num_ranks + b.dst) * p.g.max_tokens * row_bytes;
    bool posted = false;
    const int64_t count = epForEachCombineRow<kSendThreads>(
        p.g, p.a, b, [&](int64_t i, int64_t x_row, int token, int lane) {
            const int64_t dst_offset = L.combineRowOffset(b.phase, b.expert, token);
            const int64_t staged = staging_base + i * row_bytes;
            epCopyExpertRow(p.g, p.a, x_row, lsa ? lsa + dst_offset : stagingPtr(p.d, staged),
                            lane);
            if (lsa)
                return;
            __syncwarp();
            if (lane == 0) {
                __threadfence_system();
                ncclGin gin(p.d.comm, ginContext(p.d, b.dst));
                gin.put(ncclTeamWorld(p.d.comm), b.dst, p.d.window, static_cast<size_t>(dst_offset),
                        p.d.window, static_cast<size_t>(p.d.staging_offset + staged),
                        static_cast<size_t>(row_bytes));
                posted = true;
            }
        });
    if (posted) {
        // A flush covers the calling thread's puts only: each poster makes
        // its staged rows reusable by the next operation itself.
        ncclGin gin(p.d.comm, ginContext(p.d, b.dst));
        gin.flush(ncclCoopThread());
    }
    __syncthreads();  // every row's put is posted before the signal's
    if (threadIdx.x != 0)
        return;
    const int64_t word = L.combineFlagOffset(b.phase, b.expert);
    if (lsa) {
        epSignal(reinterpret_cast<uint64_t*>(lsa + word), b.seq, static_cast<uint32_t>(count));
        return;
    }
    ginSignalWord(p.d, L, b.phase, b.dst, word, b.seq, static_cast<uint32_t>(count),
                  &p.d.last_sent[p.g.num_experts + b.local_expert * num_ranks + b.dst]);
}

__global__ void __launch_bounds__(kEpCombineRecvMaxThreads) ncclCombineReceive(CombineParams p) {
    extern __shared__ int shared[];  // epCombineReceiveSharedBytes
    epCombineReceiveBlock(p.g, p.a, shared, [&](int owner, int64_t word, uint64_t seq) {
        uint32_t unused = 0;
        return waitWord(p.d, p.g, owner, word, seq, &unused);
    });
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
    ncclDispatchReceive<<<nle, kRecvThreads, epDispatchReceiveSharedBytes(g, nle), stream>>>(p);
    return cudaLaunchStatus("NCCL dispatch receive");
}

Status launchNcclCombine(const NcclEpDevice& d, const EpGroupArgs& g, const CombineArgs& a,
                         cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkCombineArgs(g, a));
    const CombineParams p{d, g, a};
    const int nle = g.num_experts / g.num_ranks;
    ncclCombineSend<<<nle * g.num_ranks, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("NCCL combine send"));
    const int blocks = epCombineReceiveGrid(g, a.num_tokens, false);  // its receive spins
    ncclCombineReceive<<<blocks, epCombineReceiveThreads(g, false),
                         epCombineReceiveSharedBytes(g, a, blocks), stream>>>(p);
    return cudaLaunchStatus("NCCL combine receive");
}

}  // namespace mooncake::ep
