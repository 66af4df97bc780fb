// Host-side argument checks and grid sizes shared by the dispatch and
// combine launches.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <string>

#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"
#include "mooncake-transfer-engine/common/env.h"

namespace mooncake::ep {
namespace {

Status bad(const std::string& what) {
    return InvalidArgument(what);
}

std::string str(int64_t v) {
    return std::to_string(v);
}

// Benchmark knobs that force a launch setting; 0 (unset) leaves it alone.
MC_ENV_INT(SendThreads, "MC_EP_SEND_THREADS", 0)
MC_ENV_INT(DispatchRecvBlocks, "MC_EP_DISPATCH_RECV_BLOCKS", 0)
MC_ENV_INT(CombineRecvBlocks, "MC_EP_COMBINE_RECV_BLOCKS", 0)
MC_ENV_INT(CombineRecvThreads, "MC_EP_COMBINE_RECV_THREADS", 0)
MC_ENV_INT(SplitReceive, "MC_EP_SPLIT_RECEIVE", 1)
MC_ENV_INT(DispatchSendByToken, "MC_EP_DISPATCH_SEND_BY_TOKEN", 1)

// A forced block size: `n` when it is a power of two in [lo, hi], else 0.
int forcedBlockSize(int64_t n, int lo, int hi) {
    return n >= lo && n <= hi && (n & (n - 1)) == 0 ? static_cast<int>(n) : 0;
}

// A forced block count: `n` when positive, else 0.
int forcedBlockCount(int64_t n) {
    return static_cast<int>(std::clamp<int64_t>(n, 0, std::numeric_limits<int>::max()));
}

// kInvalidArgument when `p` (the caller's tensor `name`) is not
// kEpRowAlignBytes-aligned.
Status checkRowAlignment(const void* p, const char* name) {
    const uintptr_t past = reinterpret_cast<uintptr_t>(p) % kEpRowAlignBytes;
    if (past == 0)
        return Status::OK();
    return bad(std::string(name) + " starts " + str(static_cast<int64_t>(past)) + " bytes past a " +
               str(kEpRowAlignBytes) +
               "-byte boundary, expected an aligned start (a view at an odd element offset: "
               "pass a copy)");
}

int localExperts(const EpGroupArgs& g) {
    return g.num_ranks > 0 ? g.num_experts / g.num_ranks : 1;
}

}  // namespace

Status checkGroupArgs(const EpGroupArgs& g) {
    if (g.num_ranks < 1 || g.num_ranks > kEpDispatchReceiveMaxPairs)
        return bad("num_ranks is " + str(g.num_ranks) + ", expected in [1, " +
                   str(kEpDispatchReceiveMaxPairs) + "]");
    if (g.rank < 0 || g.rank >= g.num_ranks)
        return bad("rank is " + str(g.rank) + ", expected in [0, " + str(g.num_ranks) + ")");
    if (g.num_experts < 1 || g.num_experts % g.num_ranks != 0 || g.num_experts > kEpMaxExperts)
        return bad("num_experts is " + str(g.num_experts) + ", expected a positive multiple of " +
                   "num_ranks (" + str(g.num_ranks) + ") up to " + str(kEpMaxExperts));
    if (g.hidden < kEpHiddenAlign || g.hidden % kEpHiddenAlign != 0)
        return bad("hidden is " + str(g.hidden) + ", expected a positive multiple of 128");
    if (g.max_tokens < 1)
        return bad("max_tokens is " + str(g.max_tokens) + ", expected >= 1");
    const int64_t need = epLayoutOf(g).totalBytes();
    if (g.local_buffer_bytes < static_cast<uint64_t>(need))
        return bad("local_buffer_bytes is " + std::to_string(g.local_buffer_bytes) +
                   ", expected at least " + str(need) + " (epBufferSizeHint for max_tokens " +
                   str(g.max_tokens) + ", hidden " + str(g.hidden) + ", num_ranks " +
                   str(g.num_ranks) + ", num_experts " + str(g.num_experts) + ")");
    if (g.local_buffer == nullptr)
        return bad("local_buffer is null, expected the rank's EP buffer");
    if (g.peer_buffers == nullptr)
        return bad("peer_buffers is null, expected a device array of num_ranks buffer pointers");
    if (g.active_ranks == nullptr)
        return bad("active_ranks is null, expected a device int32 array of num_ranks entries");
    if (g.ranks_per_device < 1 || g.ranks_per_device > g.num_ranks)
        return bad("ranks_per_device is " + str(g.ranks_per_device) + ", expected in [1, " +
                   str(g.num_ranks) + "]");
    return Status::OK();
}

int epSpinningBlocksPerRank(int sms, int ranks_per_device) {
    return std::max(1, sms / (2 * std::max(1, ranks_per_device)));
}

int epCombineReceiveBlocks(const EpGroupArgs& g, int num_tokens, int sms) {
    const int wanted = std::max(1, num_tokens);
    if (g.ranks_per_device <= 1)
        return wanted;  // its own send kernel finished before its receive began
    return std::min(wanted, epSpinningBlocksPerRank(sms, g.ranks_per_device));
}

int epSendThreads(int64_t rows, int64_t blocks) {
    static const int forced =
        forcedBlockSize(envSendThreads(), kEpMinSendThreads, kEpMaxSendThreads);
    if (forced)
        return forced;
    const int64_t per_block = blocks > 0 ? (std::max<int64_t>(rows, 0) + blocks - 1) / blocks : 0;
    int threads = kEpMinSendThreads;
    while (threads < kEpMaxSendThreads && threads / 32 < per_block)
        threads *= 2;
    return threads;
}

int epDispatchReceiveBlocks(const EpGroupArgs& g, int sms) {
    const int wanted = std::max(1, localExperts(g));
    if (g.ranks_per_device <= 1)
        return wanted;  // its own send kernel finished before its receive began
    return std::min(wanted, epSpinningBlocksPerRank(sms, g.ranks_per_device));
}

bool epDispatchSendByToken(const EpGroupArgs& g, const DispatchArgs& a) {
    static const bool on = envDispatchSendByToken() != 0;
    return on && a.use_fp8 && a.top_k <= kEpMaxTopKByToken &&
           epDispatchSendByTokenSharedBytes(g, a) <= kEpMaxSharedBytesByToken;
}

int epDispatchSendBlocks(const EpGroupArgs& g, const DispatchArgs& a) {
    return epDispatchSendByToken(g, a) ? epDispatchSendByTokenBlocks(a) : g.num_experts;
}

bool epSplitReceive(const EpGroupArgs& g) {
    static const bool on =
        envSplitReceive() != 0 && envDispatchRecvBlocks() <= 0 && envCombineRecvBlocks() <= 0;
    return on && g.ranks_per_device > 1;
}

int epDispatchReceiveGrid(const EpGroupArgs& g, bool split) {
    static const int forced = forcedBlockCount(envDispatchRecvBlocks());
    if (forced > 0)
        return std::min(forced, std::max(1, localExperts(g)));
    if (split)
        return std::max(1, localExperts(g));  // nothing spins: a block per local expert
    return epDispatchReceiveBlocks(g, g.ranks_per_device > 1 ? currentDeviceSmCount() : 0);
}

size_t epDispatchReceiveSharedBytes(const EpGroupArgs& g, int grid) {
    const int per_round = epDispatchReceiveExpertsPerRound(localExperts(g), g.num_ranks, grid);
    return 3 * sizeof(int) * static_cast<size_t>(per_round) * static_cast<size_t>(g.num_ranks);
}

size_t epCombineReceiveSharedBytes(const EpGroupArgs& g, const CombineArgs& a, int grid) {
    const int per_round = epCombineReceiveTokensPerRound(a.num_tokens, a.top_k, grid);
    return static_cast<size_t>(epCombineReceiveStateBytes(g.num_experts)) +
           sizeof(int) * static_cast<size_t>(per_round) * static_cast<size_t>(a.top_k);
}

int epCombineReceiveGrid(const EpGroupArgs& g, int num_tokens, bool split) {
    static const int forced = forcedBlockCount(envCombineRecvBlocks());
    if (forced > 0)
        return std::min(forced, std::max(1, num_tokens));
    if (split)
        return std::max(1, num_tokens);  // nothing spins: a block per token
    return epCombineReceiveBlocks(g, num_tokens,
                                  g.ranks_per_device > 1 ? currentDeviceSmCount() : 0);
}

int epCombineReceiveThreads(const EpGroupArgs& g, bool split) {
    static const int forced = forcedBlockSize(envCombineRecvThreads(), kEpCombineRecvMinThreads,
                                              kEpCombineRecvMaxThreads);
    if (forced)
        return forced;
    return g.ranks_per_device > 1 && !split ? kEpCombineRecvMaxThreads : kEpCombineRecvMinThreads;
}

namespace {

Status checkTokens(const EpGroupArgs& g, int num_tokens, int top_k) {
    if (num_tokens < 0 || num_tokens > g.max_tokens)
        return bad("num_tokens is " + str(num_tokens) +
                   ", expected in [0, max_tokens = " + str(g.max_tokens) + "]");
    if (top_k < 1 || top_k > kEpCombineReceiveMaxEntries)
        return bad("top_k is " + str(top_k) + ", expected in [1, " +
                   str(kEpCombineReceiveMaxEntries) + "]");
    return Status::OK();
}

}  // namespace

Status checkDispatchArgs(const EpGroupArgs& g, const DispatchArgs& a) {
    MC_RETURN_IF_ERROR(checkGroupArgs(g));
    MC_RETURN_IF_ERROR(checkTokens(g, a.num_tokens, a.top_k));
    if (a.num_tokens > 0 && (a.x == nullptr || a.topk_idx == nullptr))
        return bad("x or topk_idx is null with num_tokens " + str(a.num_tokens));
    MC_RETURN_IF_ERROR(checkRowAlignment(a.x, "x"));
    if (a.packed_recv_x == nullptr || a.packed_recv_count == nullptr || a.src_info == nullptr ||
        a.layout_range == nullptr)
        return bad(
            "a dispatch output (packed_recv_x, packed_recv_count, src_info, "
            "layout_range) is null");
    if (a.use_fp8 && a.packed_recv_scales == nullptr)
        return bad("packed_recv_scales is null with use_fp8, expected [nle, cap, hidden / 128]");
    return Status::OK();
}

Status checkCombineArgs(const EpGroupArgs& g, const CombineArgs& a) {
    MC_RETURN_IF_ERROR(checkGroupArgs(g));
    MC_RETURN_IF_ERROR(checkTokens(g, a.num_tokens, a.top_k));
    if (a.x == nullptr || a.src_info == nullptr || a.layout_range == nullptr)
        return bad(
            "x, src_info or layout_range is null, expected the expert outputs and the "
            "dispatch handle");
    if (a.num_tokens > 0 &&
        (a.topk_idx == nullptr || a.topk_weights == nullptr || a.out == nullptr))
        return bad("topk_idx, topk_weights or out is null with num_tokens " + str(a.num_tokens));
    MC_RETURN_IF_ERROR(checkRowAlignment(a.x, "x (expert outputs)"));
    MC_RETURN_IF_ERROR(checkRowAlignment(a.out, "out"));
    return Status::OK();
}

}  // namespace mooncake::ep
