// The thin torch layer of the EP fast path: one FastBuffer per Python
// `Buffer` owns a TransferEngine (bootstrapped through the group's c10d store
// under a per-Buffer key prefix and secret), this rank's EP buffer in device
// memory, every peer's buffer mapped over cuda_ipc, and the device table of
// peer pointers. dispatch/combine allocate their outputs with torch and
// enqueue the torch-free kernels (ep_kernels.h) on torch's current stream.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "mooncake-ep/core/direct_slots.h"
#include "mooncake-ep/ibgda/ibgda_kernels.h"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-ep/torch/ep_ops.h"

namespace mooncake::te {
class TransferEngine;
}
namespace mooncake::pg {
class C10dStoreAdapter;
}

namespace mooncake::ep {

struct FastBufferOptions {
    int rank = 0;
    int num_ranks = 0;
    int64_t num_bytes = 0;
    int device = 0;
    int ranks_per_device = 1;  // ranks of the group on this GPU (EpGroupArgs)
    std::string key_prefix;    // unique per Buffer connection, agreed by the ranks
    std::string secret;        // shared by the ranks, from rank 0
    int64_t timeout_ms = 30000;
};

class FastBuffer : public std::enable_shared_from_this<FastBuffer> {
public:
    // Starts the engine, allocates and zeroes this rank's buffer. Throws
    // std::runtime_error (std::invalid_argument for bad options) on failure.
    FastBuffer(const c10::intrusive_ptr<c10d::Store>& store, FastBufferOptions options);
    ~FastBuffer();
    FastBuffer(const FastBuffer&) = delete;
    FastBuffer& operator=(const FastBuffer&) = delete;

    // This rank's buffer address as peers see it in its segment.
    int64_t localAddress() const;
    int64_t numBytes() const { return options_.num_bytes; }
    // Maps the buffer of every peer that `p2p` marks (all when empty;
    // addresses in rank order, from the metadata exchange) within
    // timeout_ms, then uploads the peer table, where the others stay null:
    // useIbgda() must then supply the way to them. The caller meets the
    // other ranks afterwards (every buffer is zeroed before any rank's first
    // dispatch).
    void connect(const std::vector<int64_t>& peer_addresses, const std::vector<bool>& p2p = {});
    // The peers outside the peer table are reached through `device` (an
    // active IbgdaLink's, kept alive by `owner` until this buffer's kernels
    // are done). From then on the layout of the first dispatch or combine
    // (num_experts, max_tokens, hidden) is the only one accepted: the
    // IBGDA signal words' shadows assume it.
    void useIbgda(std::shared_ptr<void> owner, const IbgdaEpDevice& device);
    // Direct FP8 dispatch (docs/ep-guide.md): on when every rank of the group
    // asked for it and the buffer holds the direct area; FP8 dispatches then
    // return views of one of its slots, which the slot serves no other op
    // until every view is freed.
    void setDirectDispatch(bool on) { direct_group_ = on; }
    // Ranks without a peer-table entry (reached over IBGDA, or not at all).
    const std::vector<int>& remotePeers() const { return remote_peers_; }

    DispatchResult dispatch(const at::Tensor& x, const at::Tensor& topk_idx,
                            const at::Tensor& active_ranks, int64_t max_tokens, int64_t num_experts,
                            int64_t timeout_us, bool use_fp8);
    at::Tensor combine(const at::Tensor& x, const at::Tensor& src_info,
                       const at::Tensor& layout_range, const at::Tensor& topk_idx,
                       const at::Tensor& topk_weights, const at::Tensor& active_ranks,
                       int64_t max_tokens, int64_t num_experts, int64_t timeout_us,
                       const std::optional<at::Tensor>& out);

    // Benchmarks: the kernels write per-block timestamps into `trace` (int64
    // [kEpTraceSlots] on this buffer's device, core/phase_trace.h) from the
    // next op on; nullopt stops it. Replacing or clearing a trace waits for
    // the device (kernels in flight still write to it). Throws
    // std::invalid_argument for a bad tensor; traced ops refuse CUDA graph
    // capture.
    void setPhaseTrace(const std::optional<at::Tensor>& trace);

    // The device error word (EpError, offending value) as of the last
    // completed op, then cleared; nullopt when none was recorded. Never
    // blocks unless `wait`: a copy still in flight reads as "nothing yet".
    std::optional<std::pair<int32_t, int32_t>> takeError(bool wait);

private:
    // A direct dispatch's outputs: views of slot `slot`, `a` pointed at them.
    DispatchResult directDispatchViews(const at::Tensor& x, const at::Tensor& topk_idx,
                                       const EpLayout& L, int slot, DispatchArgs* a);
    EpGroupArgs groupArgs(const at::Tensor& active_ranks, int64_t max_tokens, int64_t num_experts,
                          int64_t hidden, int64_t timeout_us) const;
    // Throws when `g` is traced and `stream` is capturing a CUDA graph.
    void refuseTracedCapture(const EpGroupArgs& g, cudaStream_t stream) const;
    // The first op launched over IBGDA fixes the layout (useIbgda).
    void pinIbgdaShape(const EpGroupArgs& g);

    FastBufferOptions options_;
    // Kept to skip the store removals at shutdown: the keys live under this
    // connection's own prefix, and at process exit the store's server may be
    // gone already.
    std::shared_ptr<pg::C10dStoreAdapter> store_;
    std::unique_ptr<te::TransferEngine> engine_;
    void* buffer_ = nullptr;
    bool connected_ = false;
    at::Tensor peer_table_;  // int64 [num_ranks] on the device
    std::vector<int> remote_peers_;
    std::shared_ptr<void> ibgda_owner_;
    std::optional<IbgdaEpDevice> ibgda_;
    std::optional<std::array<int64_t, 3>> ibgda_shape_;  // num_experts, max_tokens, hidden
    std::unique_ptr<ErrorWord> error_;
    // Direct FP8 dispatch: every rank asked for it (setDirectDispatch); its slots.
    bool direct_group_ = false;
    EpDirectSlots direct_slots_;
    at::Tensor phase_trace_;  // undefined: no tracing
};

}  // namespace mooncake::ep
