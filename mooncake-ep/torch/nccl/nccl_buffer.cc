#include "mooncake-ep/torch/nccl/nccl_buffer.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstring>
#include <stdexcept>

namespace mooncake::ep {

NcclBuffer::NcclBuffer(const std::string& unique_id, const NcclEpOptions& options) {
    if (unique_id.size() != static_cast<size_t>(kNcclUniqueIdBytes))
        throw std::invalid_argument("Mooncake EP NCCL transport: the unique id has " +
                                    std::to_string(unique_id.size()) + " bytes, expected " +
                                    std::to_string(kNcclUniqueIdBytes));
    NcclEpOptions o = options;
    std::memcpy(o.unique_id.data(), unique_id.data(), kNcclUniqueIdBytes);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(o.device));
    Status st = NcclEpTransport::create(o, &transport_);
    if (!st.ok())
        raiseStatus(st, "setting up the NCCL device-API transport");
    error_ = std::make_unique<ErrorWord>(/*mirrored=*/false);
}

NcclBuffer::~NcclBuffer() {
    // Without destroy(): local teardown (the transport aborts its communicator).
    error_.reset();
    transport_.reset();
}

int64_t NcclBuffer::windowBytes() const {
    const NcclEpOptions& o = transport_->options();
    return ncclEpWindowBytes(o.num_ranks, o.num_experts, o.max_tokens, o.hidden);
}

void NcclBuffer::destroy() {
    if (destroyed_)
        return;
    destroyed_ = true;
    error_.reset();
    Status st = transport_->destroy();
    if (!st.ok())
        raiseStatus(st, "destroy");
}

EpGroupArgs NcclBuffer::groupArgs(const at::Tensor& active_ranks, int64_t max_tokens,
                                  int64_t num_experts, int64_t timeout_us) const {
    if (destroyed_)
        throw std::runtime_error("Mooncake EP NCCL transport: this buffer was destroyed");
    EpGroupArgs g = transport_->groupArgs(active_ranks.data_ptr<int32_t>(),
                                          timeout_us < 0 ? -1 : timeout_us * 1000);
    // A smaller per-op shape fits the window laid out for the largest one.
    g.max_tokens = static_cast<int>(max_tokens);
    g.num_experts = static_cast<int>(num_experts);
    return g;
}

DispatchResult NcclBuffer::dispatch(const at::Tensor& x, const at::Tensor& topk_idx,
                                    const at::Tensor& active_ranks, int64_t max_tokens,
                                    int64_t num_experts, int64_t timeout_us, bool use_fp8) {
    c10::cuda::CUDAGuard guard(x.device());
    const EpGroupArgs g = groupArgs(active_ranks, max_tokens, num_experts, timeout_us);
    DispatchArgs a;
    DispatchResult r =
        prepareDispatch(x, topk_idx, g.num_ranks, max_tokens, num_experts, use_fp8, &a);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
    Status st = transport_->launchDispatch(g, a, stream);
    if (!st.ok())
        raiseStatus(st, "NCCL dispatch");
    error_->record(epState(g.local_buffer), stream);
    return r;
}

at::Tensor NcclBuffer::combine(const at::Tensor& x, const at::Tensor& src_info,
                               const at::Tensor& layout_range, const at::Tensor& topk_idx,
                               const at::Tensor& topk_weights, const at::Tensor& active_ranks,
                               int64_t max_tokens, int64_t num_experts, int64_t timeout_us,
                               const std::optional<at::Tensor>& out) {
    c10::cuda::CUDAGuard guard(x.device());
    const EpGroupArgs g = groupArgs(active_ranks, max_tokens, num_experts, timeout_us);
    CombineArgs a;
    at::Tensor result = prepareCombine(x, src_info, layout_range, topk_idx, topk_weights, out, &a);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
    Status st = transport_->launchCombine(g, a, stream);
    if (!st.ok())
        raiseStatus(st, "NCCL combine");
    error_->record(epState(g.local_buffer), stream);
    return result;
}

std::optional<std::pair<int32_t, int32_t>> NcclBuffer::takeError(bool wait) {
    if (destroyed_)
        return std::nullopt;
    const EpGroupArgs g = transport_->groupArgs(nullptr, -1);
    return error_->take(epState(g.local_buffer), transport_->options().device, wait);
}

}  // namespace mooncake::ep
