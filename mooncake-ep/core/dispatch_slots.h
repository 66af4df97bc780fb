// Where the token-major dispatch send (kernels/dispatch_by_token.cu) puts
// a token's message in its expert's receive slots: slot = the tokens before
// it whose rows select the same expert, each counted once however often its
// row lists the expert (a token that lists an expert twice sends it one
// message). The expert-major send gives the same slots (token order), so
// the receive and the handle do not depend on which send ran.
//
// A block first counts, with all its threads, the selections of the tokens
// before its own (epCountSelections into a per-expert table), then each of
// its tokens adds the block's earlier tokens (epSlotInBlock): a few
// comparisons, where scanning every earlier token per message took one warp
// thousands of shared-memory reads while the block's other warps waited at
// its barrier (ncu, one H100, 1,024 tokens: half the send's stall cycles).
// Host-device, so the tests run the same code on the host.
#pragma once

#include <cstdint>

#include "mooncake-ep/core/host_device.h"

namespace mooncake::ep {

// Whether entry `i` of a row-major [tokens, top_k] id table names an
// expert (>= 0) that no earlier entry of its row names.
MC_EP_HD inline bool epFirstInRow(const int* ids, int top_k, int i) {
    const int e = ids[i];
    if (e < 0)
        return false;
    for (int j = i - i % top_k; j < i; ++j) {
        if (ids[j] == e)
            return false;
    }
    return true;
}

// Whether token `token`'s row names expert `e` (ids: the op's int64 table
// in device memory, or the send's int copy in shared memory).
template <typename Id>
MC_EP_HD bool epRowSelects(const Id* ids, int top_k, int token, int e) {
    for (int k = 0; k < top_k; ++k) {
        if (ids[static_cast<int64_t>(token) * top_k + k] == e)
            return true;
    }
    return false;
}

// One thread's share (entries first, first + stride, ...) of counting the
// tokens of [0, end_token) per expert they select: add(e) once per token
// and expert. Every share together adds each such pair once.
template <typename Add>
MC_EP_HD void epCountSelections(const int* ids, int top_k, int end_token, int first, int stride,
                                Add add) {
    for (int i = first; i < end_token * top_k; i += stride) {
        if (epFirstInRow(ids, top_k, i))
            add(ids[i]);
    }
}

// The slot of token `token`'s message to expert `e`, in a block whose first
// token is `block_first` (<= token) and whose `counts_before[e]` holds the
// tokens before `block_first` that selected e.
MC_EP_HD inline int epSlotInBlock(const int* ids, int top_k, const int* counts_before,
                                  int block_first, int token, int e) {
    int slot = counts_before[e];
    for (int t = block_first; t < token; ++t)
        slot += epRowSelects(ids, top_k, t, e) ? 1 : 0;
    return slot;
}

}  // namespace mooncake::ep
