// Dispatch and combine with IBGDA for the peers no load/store reaches: the
// kernels of kernels/dispatch.cu and kernels/combine.cu (same layout, slots,
// handles and sequence-number signals, same outputs), except that a send
// block whose destination has no entry in the peer table stages its bytes
// in local memory the NIC reads and posts them itself:
//   dispatch  the expert's messages, staged contiguously as their slots are
//             at the receiver, go in one RDMA WRITE;
//   combine   one WRITE per returned row (rows land at scattered offsets);
// then a fetch-add on the same QP raises the receiver's signal word to
// epMakeSignal(seq, count). An RC QP executes the add after the WRITEs
// before it, so a receiver that sees the word sees the data, and the
// receive kernels wait exactly as over cuda_ipc. The sender keeps, next to
// its staging, the value it last added to each remote word (the shadow), so
// the add is the difference; only this rank ever adds to those words, and the
// buffers start zeroed. A block then waits for its QP to drain (its staging
// is reused by the next operation). A post or drain that fails or passes the
// deadline marks the destination inactive in active_ranks, like a receive
// wait that times out.
//
// Because the signal words move when the layout does, a Buffer with IBGDA
// peers keeps the layout (num_experts, max_tokens, hidden) of its first
// operation (checked by the torch layer). Not yet run on hardware: see
// docs/rdma.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mooncake-ep/core/buffer_layout.h"
#include "mooncake-ep/core/host_device.h"
#include "mooncake-ep/ibgda/channel.h"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

// Fetch-add results (never read) land in the first bytes of the staging.
inline constexpr int64_t kIbgdaScratchBytes = 256;
// Before each send block's staging: the shadows of the two phases' words.
inline constexpr int64_t kIbgdaShadowBytes = 16;
// One RDMA WRITE moves less than 2^31 bytes.
inline constexpr int64_t kIbgdaMaxWriteBytes = (int64_t{1} << 31) - 1;

// Where each send block stages its bytes, for the layout of an operation.
struct IbgdaStagingLayout {
    EpLayout L;

    MC_EP_HD constexpr int64_t dispatchBlockBytes() const {
        return kIbgdaShadowBytes + L.max_tokens * L.messageBytes();
    }
    MC_EP_HD constexpr int64_t combineBlockBytes() const {
        return kIbgdaShadowBytes + L.max_tokens * L.hidden * 2;
    }
    // The dispatch block of global expert `expert`.
    MC_EP_HD constexpr int64_t dispatchBlockOffset(int64_t expert) const {
        return kIbgdaScratchBytes + expert * dispatchBlockBytes();
    }
    // The combine block of (local expert, destination rank).
    MC_EP_HD constexpr int64_t combineBlockOffset(int64_t local_expert, int64_t dst) const {
        return dispatchBlockOffset(L.num_experts) +
               (local_expert * L.num_ranks + dst) * combineBlockBytes();
    }
    MC_EP_HD constexpr int64_t totalBytes() const {
        return combineBlockOffset(L.numLocalExperts(), 0);
    }
};

// Staging bytes that hold the staging of every layout fitting in an EP
// buffer of `buffer_bytes`. Per expert, a buffer half holds 16 signal bytes
// and at least 528 payload bytes (one token of hidden 128, dispatch and
// combine); the staging holds the same payloads and 32 shadow bytes, 16 more
// than the signals took. 16 bytes per 544 of the half: half + half / 16
// always suffices.
MC_EP_HD constexpr int64_t ibgdaStagingBytesFor(int64_t buffer_bytes) {
    const int64_t half = buffer_bytes > kEpStateBytes ? (buffer_bytes - kEpStateBytes) / 2 : 0;
    return epAlignUp(kIbgdaScratchBytes + half + half / 16, kEpRegionAlign);
}

// What the kernels need to reach IBGDA peers (device addresses).
struct IbgdaEpDevice {
    IbgdaChannel* channels = nullptr;  // [num_ranks * qps_per_rank], peer-major
    int qps_per_rank = 0;
    const uint64_t* remote_bases = nullptr;  // [num_ranks]: each peer's buffer at its NIC
    const uint32_t* rkeys = nullptr;         // [num_ranks]
    char* staging = nullptr;                 // registered under staging_lkey
    uint64_t staging_bytes = 0;
    uint32_t staging_lkey = 0;
};

// The put of a send block to `dst`: `length` staged bytes at `local` to
// `remote_offset` of dst's buffer (none when 0), then the fetch-add that
// raises dst's signal word at `word_offset` from `shadow` (what this rank
// has added to it so far) to `value`. The add wraps modulo 2^64, as the
// NIC's does, so a smaller value (a lower count) is reached as well.
MC_EP_HD inline mlx5q::PutWithCount ibgdaSignalPut(const IbgdaEpDevice& d, int dst, uint64_t local,
                                                   int64_t remote_offset, int64_t length,
                                                   int64_t word_offset, uint64_t shadow,
                                                   uint64_t value) {
    mlx5q::PutWithCount p;
    p.local_addr = local;
    p.lkey = d.staging_lkey;
    p.remote_addr = d.remote_bases[dst] + static_cast<uint64_t>(remote_offset);
    p.rkey = d.rkeys[dst];
    p.length = static_cast<uint32_t>(length);
    p.counter_addr = d.remote_bases[dst] + static_cast<uint64_t>(word_offset);
    p.counter_rkey = d.rkeys[dst];
    p.add = value - shadow;
    p.old_value_addr = reinterpret_cast<uint64_t>(d.staging);  // the scratch
    p.old_value_lkey = d.staging_lkey;
    return p;
}

// Host-side checks of the IBGDA arguments for an operation of `g`'s layout
// (no CUDA call): OK or kInvalidArgument naming the value.
Status checkIbgdaArgs(const IbgdaEpDevice& d, const EpGroupArgs& g);

// As launchDispatch/launchCombine (ep_kernels.h); peers whose entry in
// g.peer_buffers is null are reached through `d`.
Status launchIbgdaDispatch(const IbgdaEpDevice& d, const EpGroupArgs& g, const DispatchArgs& a,
                           cudaStream_t stream);
Status launchIbgdaCombine(const IbgdaEpDevice& d, const EpGroupArgs& g, const CombineArgs& a,
                          cudaStream_t stream);

}  // namespace mooncake::ep
