// The cuda_ipc dispatch send organised by token (dispatch.cu chooses it,
// epDispatchSendByToken): a token is read and quantized once, by
// kWarpsPerToken warps that each take a share of its channels, and every
// share is stored to each of the token's destinations. The expert-major
// send reads and quantizes a token once per expert it selected, and has a
// block per global expert to schedule where this has one per
// kTokensPerBlock tokens. Slots are the expert-major send's (a token's
// slot for expert e counts the earlier tokens that selected e), so the
// receive and the handle are the same. The counts go out from the grid's
// last block once every block's messages are written (EpState's
// dispatch_send_done counts the blocks that finished).
#include <cuda_bf16.h>

#include "mooncake-ep/core/dispatch_slots.h"
#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/direct_dispatch.cuh"
#include "mooncake-ep/kernels/ep_blocks.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-ep/kernels/message.cuh"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerToken = 4;
constexpr int kTokensPerBlock = kThreads / 32 / kWarpsPerToken;

struct Params {
    EpGroupArgs g;
    DispatchArgs a;
};

// Direct dispatch: the first of this rank's `total` rows for expert `e` in
// slot `slot` of its owner (the one it named for op `seq`), or
// kEpDirectRefused. The first
// block to need it reserves them on the owner's counter and publishes the
// base in this rank's reservation word for e (tagged with seq); the others
// wait for that word, which a running block is about to write.
__device__ uint32_t directBase(const EpGroupArgs& g, const EpLayout& L, int e, int total,
                               uint64_t seq, int slot) {
    auto* word = reinterpret_cast<unsigned long long*>(static_cast<char*>(g.local_buffer) +
                                                       L.directReserveOffset(e));
    const uint32_t tag = static_cast<uint32_t>(seq);
    const unsigned long long pending =
        (static_cast<unsigned long long>(tag) << 32) | kEpDirectPending;
    unsigned long long v = *reinterpret_cast<volatile unsigned long long*>(word);
    if (static_cast<uint32_t>(v >> 32) != tag) {
        const unsigned long long old = atomicCAS(word, v, pending);
        if (old == v) {
            const int nle = static_cast<int>(L.numLocalExperts());
            auto* counter = reinterpret_cast<uint64_t*>(
                static_cast<char*>(g.peer_buffers[e / nle]) + L.directCounterOffset(slot, e % nle));
            const uint32_t base = epDirectReserve(counter, seq, static_cast<uint32_t>(total));
            atomicExch(word, (static_cast<unsigned long long>(tag) << 32) | base);
            return base;
        }
        v = old;
    }
    while (static_cast<uint32_t>(v >> 32) != tag || static_cast<uint32_t>(v) == kEpDirectPending)
        v = *reinterpret_cast<volatile unsigned long long*>(word);
    return static_cast<uint32_t>(v);
}

// The token's first warp, a lane per top-k entry: the remote messages of
// `token` (ids: the op's top-k entries in shared memory, -1 where out of
// range), one per distinct expert whose owner is active, into msgs[0, n);
// returns n on every lane. The entries are looked at in parallel: one lane
// walking them waited a global load (active_ranks) and a slot count per
// entry in turn while the block's other warps idled at its barrier.
// counts_before: the block's table of epSlotInBlock.
__device__ int findMessages(const EpGroupArgs& g, const DispatchArgs& a, const EpLayout& L,
                            const int* ids, const int* counts_before, const int* totals,
                            int block_first, int token, uint64_t seq, EpRowDest* dests, int lane) {
    const int phase = static_cast<int>(seq & 1);
    const int nle = static_cast<int>(L.numLocalExperts());
    int n = 0;
    for (int k0 = 0; k0 < a.top_k; k0 += 32) {
        const int k = k0 + lane;
        const int i = token * a.top_k + k;
        // None, or a token that lists e twice is sent once. A receive's
        // timeout may mark the rank meanwhile: read once.
        bool send = k < a.top_k && epFirstInRow(ids, a.top_k, i) &&
                    epLoadVolatile(&g.active_ranks[ids[i] / nle]) != 0;
        EpRowDest dest{};
        if (send) {
            const int e = ids[i];
            const int slot = epSlotInBlock(ids, a.top_k, counts_before, block_first, token, e);
            char* peer = static_cast<char*>(g.peer_buffers[e / nle]);
            const int named = a.direct ? epDirectNamedSlot(peer, L, seq) : -1;
            if (named >= 0) {
                const uint32_t base = directBase(g, L, e, totals[e], seq, named);
                const int64_t in_expert = static_cast<int64_t>(base) + slot;
                // Refused, or a counter gone wrong: never write past the slot.
                send = base != kEpDirectRefused && in_expert < L.capacity();
                dest = epDirectRow(peer, L, named, (e % nle) * L.capacity() + in_expert);
            } else {
                dest =
                    epMessageDest(L, peer + L.dispatchMessageOffset(phase, e % nle, g.rank, slot));
            }
        }
        const unsigned senders = __ballot_sync(0xffffffffu, send);
        if (send)
            dests[n + __popc(senders & ((1u << lane) - 1))] = dest;
        n += __popc(senders);
    }
    return n;
}

// The grid's last block: one count per expert, after every block's messages.
// `counts` holds the selections of the tokens before `counted_tokens`.
__device__ void sendCounts(const EpGroupArgs& g, const DispatchArgs& a, const EpLayout& L,
                           const int* ids, int* counts, int counted_tokens, uint64_t seq) {
    const int nle = static_cast<int>(L.numLocalExperts());
    const int phase = static_cast<int>(seq & 1);
    epCountSelections(ids, a.top_k, a.num_tokens, counted_tokens * a.top_k + threadIdx.x,
                      blockDim.x, [&](int e) { atomicAdd(&counts[e], 1); });
    if (threadIdx.x == 0)
        epDirectPublishName(g, a, L, seq);  // the counts below publish it
    __syncthreads();
    for (int e = threadIdx.x; e < g.num_experts; e += blockDim.x) {
        // Read again now: a block that started later may have seen a rank
        // inactive and sent it nothing (entries only go from 1 to 0).
        if (epLoadVolatile(&g.active_ranks[g.rank]) == 0 ||
            epLoadVolatile(&g.active_ranks[e / nle]) == 0)
            continue;
        char* remote = static_cast<char*>(g.peer_buffers[e / nle]);
        if (a.direct && counts[e] > 0) {
            // Where this rank's rows went (its reservation word, if it wrote
            // them into a slot this op), before the count.
            const uint64_t reserved = *reinterpret_cast<volatile uint64_t*>(
                static_cast<char*>(g.local_buffer) + L.directReserveOffset(e));
            if (epSignalMatches(reserved, seq))
                *reinterpret_cast<volatile uint64_t*>(
                    remote + L.directBaseOffset(phase, e % nle, g.rank)) = reserved;
        }
        epSignal(
            reinterpret_cast<uint64_t*>(remote + L.dispatchCountOffset(phase, e % nle, g.rank)),
            seq, static_cast<uint32_t>(counts[e]));
    }
}

__global__ void __launch_bounds__(kThreads) dispatchSendByToken(Params p) {
    const EpGroupArgs& g = p.g;
    const DispatchArgs& a = p.a;
    epTrace(g, kEpTraceDispatchSend, kEpTraceStart);
    // ids [num_tokens * top_k], then counts [num_experts]: the selections
    // of the tokens before this block's (epSlotInBlock), later the last
    // block's totals (sendCounts); a direct dispatch then has totals
    // [num_experts]: every token's selections (directBase reserves them).
    extern __shared__ int shared[];
    int* ids = shared;
    __shared__ EpRowDest msgs[kTokensPerBlock][kEpMaxTopKByToken];
    __shared__ int num_msgs[kTokensPerBlock];
    __shared__ bool self_active, last_block;
    const EpLayout L = epLayoutOf(g);
    EpState* state = epState(g.local_buffer);
    const uint64_t seq = state->dispatch_seq + 1;
    if (blockIdx.x == 0)
        epCheckExpertIds(g, a, state);
    const int entries = a.num_tokens * a.top_k;
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
        const int64_t id = a.topk_idx[i];
        ids[i] = id >= 0 && id < g.num_experts ? static_cast<int>(id) : -1;
    }
    int* counts = shared + entries;
    int* totals = counts + g.num_experts;  // direct only: every token's selections
    for (int e = threadIdx.x; e < g.num_experts; e += blockDim.x) {
        counts[e] = 0;
        if (a.direct)
            totals[e] = 0;
    }
    if (threadIdx.x == 0)
        self_active = epLoadVolatile(&g.active_ranks[g.rank]) != 0;
    __syncthreads();
    const int block_first = static_cast<int>(blockIdx.x) * kTokensPerBlock;
    const int counted_tokens = block_first < a.num_tokens ? block_first : a.num_tokens;
    epCountSelections(ids, a.top_k, counted_tokens, threadIdx.x, blockDim.x,
                      [&](int e) { atomicAdd(&counts[e], 1); });
    if (a.direct)
        epCountSelections(ids, a.top_k, a.num_tokens, threadIdx.x, blockDim.x,
                          [&](int e) { atomicAdd(&totals[e], 1); });
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int slot = warp / kWarpsPerToken, part = warp % kWarpsPerToken;
    const int token = block_first + slot;
    if (part == 0) {
        const bool mine = self_active && token < a.num_tokens;
        const int n = mine ? findMessages(g, a, L, ids, counts, totals, block_first, token, seq,
                                          msgs[slot], lane)
                           : 0;
        if (lane == 0)
            num_msgs[slot] = n;
    }
    __syncthreads();
    if (num_msgs[slot] > 0)
        epWriteMessageParts(g, a, token, msgs[slot], num_msgs[slot], part, kWarpsPerToken, lane);
    __syncthreads();
    epTrace(g, kEpTraceDispatchSend, kEpTraceMiddle);
    if (threadIdx.x == 0) {
        __threadfence_system();  // this block's messages before its share of the counter
        last_block = atomicAdd(&state->dispatch_send_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last_block) {
        __threadfence();
        sendCounts(g, a, L, ids, counts, counted_tokens, seq);
        if (threadIdx.x == 0)
            state->dispatch_send_done = 0;  // for the next op (stream order)
    }
    epTrace(g, kEpTraceDispatchSend, kEpTraceEnd);
}

}  // namespace

size_t epDispatchSendByTokenSharedBytes(const EpGroupArgs& g, const DispatchArgs& a) {
    // ids, counts, and for a direct dispatch totals.
    const size_t tables = a.direct ? 2 : 1;
    return sizeof(int) * (static_cast<size_t>(a.num_tokens) * a.top_k + tables * g.num_experts);
}

int epDispatchSendByTokenBlocks(const DispatchArgs& a) {
    return a.num_tokens > 0 ? (a.num_tokens + kTokensPerBlock - 1) / kTokensPerBlock : 1;
}

void launchDispatchSendByToken(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream) {
    dispatchSendByToken<<<epDispatchSendByTokenBlocks(a), kThreads,
                          epDispatchSendByTokenSharedBytes(g, a), stream>>>(Params{g, a});
}

}  // namespace mooncake::ep
