// The symmetric per-rank EP buffer: every rank allocates the same layout, so
// a sender computes an offset once and adds it to the peer's mapped base.
//
//   [0, kEpStateBytes)              EpState: this rank's own counters (never
//                                   written by peers)
//   half 0, half 1 (phase bit)      each:
//     signals                       dispatch counts u64 [nle][num_ranks],
//                                   combine flags u64 [num_experts], padded
//                                   to 256 bytes
//     dispatch receive region       messages [nle][num_ranks][max_tokens]
//     combine receive region        BF16 rows [num_experts][max_tokens][hidden]
//   direct area (only in buffers of directTotalBytes(); direct FP8
//   dispatch, kernels/direct_dispatch.cuh): see EpLayout::direct*
//
// A message is a 128-byte header (int32 source token index, the rest unused)
// and the payload: BF16 hidden*2 bytes, or FP8 hidden bytes followed by
// hidden/128 float scales. The header is a whole cache line so that the
// payload and the scales start 128-byte aligned and a warp's stores fill
// whole lines: with a 16-byte header FP8 dispatch was about 7% slower
// (docs/ep-guide.md, session 44). The slot stride is the BF16 size, so the layout
// does not depend on use_fp8. Operation number `seq` (1, 2, ...) uses half
// seq & 1: a sender can be at most one operation ahead of any receiver (its
// next receive waits for that receiver's send), so the half it writes is
// never the one being read. The formula is in docs/ep-kernels.md.
#pragma once

#include <cstdint>

#include "mooncake-ep/core/host_device.h"

namespace mooncake::ep {

inline constexpr int64_t kEpHiddenAlign = 128;  // channels per FP8 scale
inline constexpr int64_t kEpMessageHeaderBytes = 128;
inline constexpr int64_t kEpStateBytes = 256;
inline constexpr int64_t kEpRegionAlign = 256;
// Packed FP8 receives a buffer keeps for direct dispatch: one an op's
// outputs still held by the caller, one being written, one named for the
// next op (a loop rebinds its outputs only after the next call returns).
inline constexpr int kEpDirectSlots = 3;

// Local bookkeeping at offset 0 of the buffer. The sequence numbers make the
// kernels graph-replayable: each operation reads its number here instead of
// taking it from the host.
struct EpState {
    uint64_t dispatch_seq;        // last completed dispatch (0: none yet)
    uint64_t combine_seq;         // last completed combine
    uint32_t dispatch_done;       // blocks of the running dispatch receive that finished
    uint32_t combine_done;        // blocks of the running combine receive that finished
    int32_t error_code;           // EpError; the first error wins, the caller clears it
    int32_t error_info;           // the offending value (e.g. the expert id)
    uint32_t dispatch_send_done;  // blocks of the running token-major dispatch send that finished
};
static_assert(sizeof(EpState) <= kEpStateBytes, "EpState outgrew its reserved bytes");

// Reported through EpState::error_code; never a trap.
enum EpError : int32_t {
    kEpErrorNone = 0,
    kEpErrorBadExpertId = 1,  // a topk_idx entry outside [-1, num_experts); error_info = the id
};

MC_EP_HD constexpr int64_t epAlignUp(int64_t v, int64_t a) {
    return (v + a - 1) / a * a;
}

struct EpLayout {
    int64_t num_ranks;
    int64_t num_experts;
    int64_t max_tokens;  // num_max_dispatch_tokens_per_rank
    int64_t hidden;

    MC_EP_HD constexpr int64_t numLocalExperts() const { return num_experts / num_ranks; }
    MC_EP_HD constexpr int64_t messageBytes() const { return kEpMessageHeaderBytes + 2 * hidden; }
    MC_EP_HD constexpr int64_t fp8ScaleOffset() const { return kEpMessageHeaderBytes + hidden; }
    MC_EP_HD constexpr int64_t signalBytes() const {
        return epAlignUp(8 * (numLocalExperts() * num_ranks + num_experts), kEpRegionAlign);
    }
    MC_EP_HD constexpr int64_t dispatchRegionBytes() const {
        return numLocalExperts() * num_ranks * max_tokens * messageBytes();
    }
    MC_EP_HD constexpr int64_t combineRegionBytes() const {
        return num_experts * max_tokens * hidden * 2;
    }
    MC_EP_HD constexpr int64_t halfBytes() const {
        return signalBytes() + dispatchRegionBytes() + combineRegionBytes();
    }
    MC_EP_HD constexpr int64_t totalBytes() const { return kEpStateBytes + 2 * halfBytes(); }

    MC_EP_HD constexpr int64_t halfOffset(int phase) const {
        return kEpStateBytes + phase * halfBytes();
    }
    MC_EP_HD constexpr int64_t dispatchCountOffset(int phase, int64_t local_expert,
                                                   int64_t src_rank) const {
        return halfOffset(phase) + 8 * (local_expert * num_ranks + src_rank);
    }
    MC_EP_HD constexpr int64_t combineFlagOffset(int phase, int64_t expert) const {
        return halfOffset(phase) + 8 * (numLocalExperts() * num_ranks + expert);
    }
    MC_EP_HD constexpr int64_t dispatchMessageOffset(int phase, int64_t local_expert,
                                                     int64_t src_rank, int64_t slot) const {
        return halfOffset(phase) + signalBytes() +
               ((local_expert * num_ranks + src_rank) * max_tokens + slot) * messageBytes();
    }
    MC_EP_HD constexpr int64_t combineRowOffset(int phase, int64_t expert, int64_t token) const {
        return halfOffset(phase) + signalBytes() + dispatchRegionBytes() +
               (expert * max_tokens + token) * hidden * 2;
    }

    // Direct FP8 dispatch (on unless MC_EP_DIRECT_DISPATCH=0; direct_dispatch.cuh):
    // after the two halves, a header: this rank's reservation words u64
    // [num_experts] (its own), its slot names u64 [2] (which slot its next
    // op's senders write into, read by peers), base words u64 [2][nle]
    // [num_ranks] (peers report where their rows went); then kEpDirectSlots
    // slots, each a packed FP8 receive in the output layout: row counters
    // u64 [nle] (peers reserve rows here), data [nle][cap][hidden], scales
    // float [nle][cap][hidden / 128], src_info int32 [nle][cap].
    MC_EP_HD constexpr int64_t capacity() const { return num_ranks * max_tokens; }
    MC_EP_HD constexpr int64_t directHeaderBytes() const {
        return epAlignUp(8 * num_experts + 16 + 16 * numLocalExperts() * num_ranks, kEpRegionAlign);
    }
    MC_EP_HD constexpr int64_t directCountersBytes() const {
        return epAlignUp(8 * numLocalExperts(), kEpRegionAlign);
    }
    MC_EP_HD constexpr int64_t directDataBytes() const {
        return epAlignUp(numLocalExperts() * capacity() * hidden, kEpRegionAlign);
    }
    MC_EP_HD constexpr int64_t directScalesBytes() const {
        return epAlignUp(numLocalExperts() * capacity() * (hidden / kEpHiddenAlign) * 4,
                         kEpRegionAlign);
    }
    MC_EP_HD constexpr int64_t directSrcBytes() const {
        return epAlignUp(numLocalExperts() * capacity() * 4, kEpRegionAlign);
    }
    MC_EP_HD constexpr int64_t directSlotBytes() const {
        return directCountersBytes() + directDataBytes() + directScalesBytes() + directSrcBytes();
    }
    MC_EP_HD constexpr int64_t directTotalBytes() const {
        return totalBytes() + directHeaderBytes() + kEpDirectSlots * directSlotBytes();
    }
    MC_EP_HD constexpr int64_t directReserveOffset(int64_t expert) const {
        return totalBytes() + 8 * expert;
    }
    MC_EP_HD constexpr int64_t directNameOffset(int phase) const {
        return totalBytes() + 8 * num_experts + 8 * phase;
    }
    MC_EP_HD constexpr int64_t directBaseOffset(int phase, int64_t local_expert,
                                                int64_t src_rank) const {
        return totalBytes() + 8 * num_experts + 16 +
               8 * ((phase * numLocalExperts() + local_expert) * num_ranks + src_rank);
    }
    MC_EP_HD constexpr int64_t directSlotOffset(int slot) const {
        return totalBytes() + directHeaderBytes() + slot * directSlotBytes();
    }
    MC_EP_HD constexpr int64_t directCounterOffset(int slot, int64_t local_expert) const {
        return directSlotOffset(slot) + 8 * local_expert;
    }
    MC_EP_HD constexpr int64_t directDataOffset(int slot) const {
        return directSlotOffset(slot) + directCountersBytes();
    }
    MC_EP_HD constexpr int64_t directScalesOffset(int slot) const {
        return directDataOffset(slot) + directDataBytes();
    }
    MC_EP_HD constexpr int64_t directSrcOffset(int slot) const {
        return directScalesOffset(slot) + directScalesBytes();
    }
};

// Bytes of the EP buffer for these limits (the same on every rank):
// 256 + 2 * (align256(16 * num_experts)
//            + num_experts * max_tokens * (128 + 2 * hidden)    dispatch
//            + num_experts * max_tokens * 2 * hidden)           combine
MC_EP_HD constexpr int64_t epBufferSizeHint(int64_t max_tokens, int64_t hidden, int64_t num_ranks,
                                            int64_t num_experts) {
    return EpLayout{num_ranks, num_experts, max_tokens, hidden}.totalBytes();
}

}  // namespace mooncake::ep
