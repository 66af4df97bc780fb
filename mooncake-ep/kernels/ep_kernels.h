// Launch API of the EP dispatch/combine kernels: raw device pointers, sizes
// and a stream, no torch. Every launch checks its arguments on the host
// (errors name the argument, its value and what was expected), then enqueues
// kernels that never synchronize with the CPU, so a dispatch/combine step can
// be captured in a CUDA graph and replayed.
//
// Before the first operation every rank zeroes its whole buffer and the
// ranks meet (a barrier): the sequence numbers and signals start at zero.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "mooncake-ep/core/buffer_layout.h"
#include "mooncake-ep/core/host_device.h"
#include "mooncake-ep/core/phase_trace.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

// What every operation of one EP group shares.
struct EpGroupArgs {
    int rank = 0;
    int num_ranks = 0;
    int num_experts = 0;
    int max_tokens = 0;  // num_max_dispatch_tokens_per_rank
    int hidden = 0;      // a multiple of 128
    void* local_buffer = nullptr;
    uint64_t local_buffer_bytes = 0;  // at least epBufferSizeHint(...)
    // Device array [num_ranks]: every rank's buffer as mapped here (entry
    // `rank` is local_buffer).
    void* const* peer_buffers = nullptr;
    // Device int32 [num_ranks]. Ranks at 0 are skipped; a wait that times out
    // sets its peer's entry to 0 and goes on.
    int32_t* active_ranks = nullptr;
    int64_t timeout_ns = -1;  // per wait; < 0 waits without a deadline
    // How many ranks of the group run their kernels on this rank's GPU (one
    // per GPU in production; several processes on one GPU under MPS in
    // tests). It bounds the grids whose blocks spin on peers' signals.
    int ranks_per_device = 1;
    // Device [kEpTraceSlots] or null: per-block timestamps for benchmarks
    // (core/phase_trace.h).
    uint64_t* phase_trace = nullptr;
    // Host-mapped int32 [2] or null: the last receive block of each op copies
    // EpState's error_code and error_info here, so that the host reads the
    // op's errors after its event without a copy queued behind the kernel.
    int32_t* error_mirror = nullptr;
};

// The kernels move the BF16 rows of the caller's tensors (dispatch x,
// combine x and out) in 16-byte words, so those must start 16-byte aligned:
// a contiguous view at an odd element offset is not (checked below).
inline constexpr uintptr_t kEpRowAlignBytes = 16;

struct DispatchArgs {
    const void* x = nullptr;            // BF16 [num_tokens, hidden]
    const int64_t* topk_idx = nullptr;  // [num_tokens, top_k], -1 = none
    int num_tokens = 0;                 // <= max_tokens
    int top_k = 0;
    bool use_fp8 = false;
    // Outputs (nle = num_experts / num_ranks, cap = num_ranks * max_tokens):
    void* packed_recv_x = nullptr;         // BF16 or FP8 E4M3 [nle, cap, hidden]
    float* packed_recv_scales = nullptr;   // use_fp8 only: [nle, cap, hidden / 128]
    int32_t* packed_recv_count = nullptr;  // [nle]
    int32_t* src_info = nullptr;           // [nle, cap]: source token index
    int64_t* layout_range = nullptr;       // [nle, num_ranks]: begin << 32 | count
    // Direct FP8 dispatch (kernels/direct_dispatch.cuh). `direct`: every rank
    // of the group runs it and the buffers hold the direct area (EpLayout::
    // direct*): this rank publishes slot names, its token-major FP8 send
    // writes rows into the slot each owner named, and its FP8 receive looks
    // for rows in the slot it named. `direct_slot`: the slot packed_recv_x,
    // scales and src_info are views of (-1: tensors of their own).
    // `next_slot`: the slot this op names for this rank's next op (-1: none).
    bool direct = false;
    int direct_slot = -1;
    int next_slot = -1;
};

struct CombineArgs {
    const void* x = nullptr;  // BF16 expert outputs [nle, cap, hidden]
    // The handle of the matching dispatch.
    const int32_t* src_info = nullptr;
    const int64_t* layout_range = nullptr;
    const int64_t* topk_idx = nullptr;    // the dispatch's [num_tokens, top_k]
    const float* topk_weights = nullptr;  // [num_tokens, top_k]
    int num_tokens = 0;
    int top_k = 0;
    void* out = nullptr;  // BF16 [num_tokens, hidden]
};

// The layout the group's arguments describe.
MC_EP_HD inline EpLayout epLayoutOf(const EpGroupArgs& g) {
    return EpLayout{g.num_ranks, g.num_experts, g.max_tokens, g.hidden};
}

// Host-side checks only (no CUDA call): OK or kInvalidArgument.
Status checkGroupArgs(const EpGroupArgs& g);
Status checkDispatchArgs(const EpGroupArgs& g, const DispatchArgs& a);
Status checkCombineArgs(const EpGroupArgs& g, const CombineArgs& a);

// Blocks of a combine receive grid (each loops over tokens) on a GPU of
// `sms` SMs: one per token, except when ranks share the GPU. Receive blocks
// spin until their peers' send kernels signal, and had the sharing ranks'
// spinning blocks covered every SM, a rank whose send kernel had not been
// scheduled yet might never be. Blocks of different MPS clients share an
// SM only as the scheduler balances load (NVIDIA's MPS documentation), so
// spare registers on an SM are no guarantee: the bound is dispatch's
// (epSpinningBlocksPerRank). Two blocks per SM across the ranks, the bound
// before, let 8 ranks' 264 spinning blocks outnumber an H100's 132 SMs, and
// 8-process benchmark runs stalled in combine (2026-12-06). Pure: the
// launch passes the current device's SM count.
int epCombineReceiveBlocks(const EpGroupArgs& g, int num_tokens, int sms);
// The same for a launch on the current device, which is asked for its SM
// count only when ranks share it (the grid depends on it only then), or
// MC_EP_COMBINE_RECV_BLOCKS (clamped to [1, tokens]) for benchmarks that
// probe the bound; `split` (epSplitReceive): the copy kernel's grid, a
// block per token.
int epCombineReceiveGrid(const EpGroupArgs& g, int num_tokens, bool split);

// Threads of a combine receive block. A block reduces one token at a time,
// its threads over the hidden channels: 256 when every token has a block of
// its own; when ranks share the GPU the grid is bounded and each block
// loops over several tokens, so it gets kEpCombineRecvMaxThreads (one pass
// over a 7168-channel row's 896 16-byte words instead of four).
// A split receive's copy kernel has a block per token: 256.
// MC_EP_COMBINE_RECV_THREADS=256|512|1024 forces it, for benchmarks.
inline constexpr int kEpCombineRecvMinThreads = 256;
inline constexpr int kEpCombineRecvMaxThreads = 1024;
int epCombineReceiveThreads(const EpGroupArgs& g, bool split);

// A combine receive block waits for the flags of all the experts a round of
// its tokens selected at once: it keeps a byte per expert and top_k ints
// per token of the round in shared memory, at most this many ints a round.
// They bound top_k and num_experts (the launch checks say so).
inline constexpr int kEpCombineReceiveMaxEntries = 4096;
inline constexpr int kEpMaxExperts = 16384;
MC_EP_HD constexpr int64_t epCombineReceiveStateBytes(int64_t num_experts) {
    return (num_experts + 15) / 16 * 16;
}
// Items (tokens, local experts) a receive block of a `grid`-block launch
// takes per round: all of its share of `items`, unless they need more than
// `budget` shared-memory units at `per_item` each; at least one.
MC_EP_HD constexpr int epReceiveItemsPerRound(int items, int grid, int budget, int per_item) {
    const int per_block = (items + grid - 1) / grid;
    const int fit = budget / per_item;
    const int n = per_block < fit ? per_block : fit;
    return n > 1 ? n : 1;
}
// Tokens a combine receive block of a `grid`-block launch takes per round:
// all it has, unless their top-k entries pass kEpCombineReceiveMaxEntries.
MC_EP_HD constexpr int epCombineReceiveTokensPerRound(int num_tokens, int top_k, int grid) {
    return epReceiveItemsPerRound(num_tokens, grid, kEpCombineReceiveMaxEntries, top_k);
}
// The dynamic shared memory of such a launch.
size_t epCombineReceiveSharedBytes(const EpGroupArgs& g, const CombineArgs& a, int grid);

// How many spinning receive blocks each of `ranks_per_device` ranks sharing
// a GPU of `sms` SMs may launch: together half as many as it has SMs, so
// that whatever the block scheduler does, SMs stay free for send kernels
// not scheduled yet. At least one.
int epSpinningBlocksPerRank(int sms, int ranks_per_device);

// Whether a receive runs split in two kernels: one block that spins until
// every signal the op needs is in (or its peer timed out), then, queued
// after it, a copy kernel with a block per local expert (dispatch) or per
// token (combine) that reads the signals without spinning. Ranks sharing a
// GPU must keep spinning blocks to a few SMs (epSpinningBlocksPerRank), and
// the copies are most of a receive's time: split, they get the whole GPU.
// On when ranks share the GPU; MC_EP_SPLIT_RECEIVE=0 turns it off (for
// benchmarks), as does a forced receive grid (MC_EP_*_RECV_BLOCKS).
bool epSplitReceive(const EpGroupArgs& g);
inline constexpr int kEpReceiveWaitThreads = 1024;

// Blocks of a dispatch receive grid (each loops over local experts) on a
// GPU of `sms` SMs: one per local expert, except when ranks share the GPU.
// A receive block (512 threads, 60 to 82 registers each as builds go) holds
// half or more of an SM's registers while it spins on its peers' counts,
// and a 512-thread send block needs half: had the ranks' receive blocks
// filled every SM, a rank whose send kernel had not been scheduled yet
// would never be, and every rank would wait for it (seen on one H200 with
// 8 processes whose kernels the benchmark's aligned pad started at once).
// The ranks sharing a GPU together keep their receive blocks to half as
// many as it has SMs (epSpinningBlocksPerRank). Pure: the launch passes the
// current device's SM count.
int epDispatchReceiveBlocks(const EpGroupArgs& g, int sms);
// A dispatch receive block waits for the counts of many (local expert,
// source) pairs at once and keeps three ints per pair in shared memory:
// at most this many pairs, 48 KiB, per round. It also bounds num_ranks
// (one expert's pairs must fit a round).
inline constexpr int kEpDispatchReceiveMaxPairs = 4096;
// Local experts a dispatch receive block of a `grid`-block launch takes per
// round: all it has, unless their pairs pass kEpDispatchReceiveMaxPairs.
MC_EP_HD constexpr int epDispatchReceiveExpertsPerRound(int nle, int num_ranks, int grid) {
    return epReceiveItemsPerRound(nle, grid, kEpDispatchReceiveMaxPairs, num_ranks);
}
// The dynamic shared memory of such a launch.
size_t epDispatchReceiveSharedBytes(const EpGroupArgs& g, int grid);
// The launch's grid: epDispatchReceiveBlocks, or MC_EP_DISPATCH_RECV_BLOCKS
// (clamped to [1, local experts]) for benchmarks that probe the bound; a
// value that lets spinning blocks fill the GPU can hang ranks sharing it;
// `split` (epSplitReceive): the copy kernel's grid, a block per local expert.
int epDispatchReceiveGrid(const EpGroupArgs& g, bool split);

// Threads of a send block (dispatch: a block per global expert; combine: a
// block per local expert and destination), which copies one row per warp:
// the warps for the rows a block gets with uniform routing (`rows` spread
// over `blocks`), rounded up to a power of two, from 4 to 16 warps. Warps
// with no row still hold an SM's thread slots until their block ends, and
// ranks sharing a GPU run short of those first. MC_EP_SEND_THREADS (128,
// 256 or 512) overrides it, for benchmarks; any other value is ignored.
int epSendThreads(int64_t rows, int64_t blocks);
inline constexpr int kEpMinSendThreads = 128;
inline constexpr int kEpMaxSendThreads = 512;

// The cuda_ipc dispatch send is token-major (dispatch_by_token.cu: a token
// read and quantized once, a block per kTokensPerBlock tokens) for FP8
// where its shared memory holds the op's top-k ids and a count per expert
// (at most kEpMaxSharedBytesByToken) and top_k <= kEpMaxTopKByToken;
// expert-major (a block per global expert) otherwise, and for the IBGDA and
// NCCL transports, whose sends stage per expert. BF16 stays expert-major:
// with nothing to quantize, its twice larger stores want the expert-major
// grid's warps (8 processes on one H100: 0.200 ms against 0.219 token-major;
// FP8: 0.186 against 0.206). MC_EP_DISPATCH_SEND_BY_TOKEN=0 forces
// expert-major, for benchmarks.
inline constexpr int kEpMaxTopKByToken = 16;
inline constexpr size_t kEpMaxSharedBytesByToken = 40 * 1024;
bool epDispatchSendByToken(const EpGroupArgs& g, const DispatchArgs& a);
size_t epDispatchSendByTokenSharedBytes(const EpGroupArgs& g, const DispatchArgs& a);
int epDispatchSendByTokenBlocks(const DispatchArgs& a);
// The cuda_ipc dispatch send's grid, whichever it is.
int epDispatchSendBlocks(const EpGroupArgs& g, const DispatchArgs& a);
void launchDispatchSendByToken(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream);

// Enqueue on `stream`; kInternal when the launch itself fails.
Status launchDispatch(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream);
Status launchCombine(const EpGroupArgs& g, const CombineArgs& a, cudaStream_t stream);
// Their receive kernels alone (arguments already checked), for transports
// whose signal words and data land in the local buffer as cuda_ipc's do
// (IBGDA): the sender differs, the wait does not.
Status launchDispatchReceive(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream);
Status launchCombineReceive(const EpGroupArgs& g, const CombineArgs& a, cudaStream_t stream);

// The local buffer's EpState (device memory).
MC_EP_HD inline EpState* epState(void* local_buffer) {
    return static_cast<EpState*>(local_buffer);
}

}  // namespace mooncake::ep
