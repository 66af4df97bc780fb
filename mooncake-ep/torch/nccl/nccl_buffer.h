// The thin torch layer of the NCCL device-API transport: one NcclBuffer per
// ElasticBuffer generation that selected NCCL (python/mooncake/_ep_nccl.py).
// Same dispatch/combine/take_error surface as FastBuffer, so the Python
// `Buffer` logic (checks, handles, events) drives both.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "mooncake-ep/nccl/nccl_transport.h"
#include "mooncake-ep/torch/ep_ops.h"

namespace mooncake::ep {

class NcclBuffer {
public:
    // Collective over the group (the unique id is rank 0's, broadcast by the
    // caller). Throws std::runtime_error naming the NCCL step that failed.
    NcclBuffer(const std::string& unique_id, const NcclEpOptions& options);
    ~NcclBuffer();

    int64_t windowBytes() const;
    int lsaSize() const { return transport_->lsaSize(); }
    // Collective; afterwards every op raises. Idempotent.
    void destroy();

    DispatchResult dispatch(const at::Tensor& x, const at::Tensor& topk_idx,
                            const at::Tensor& active_ranks, int64_t max_tokens, int64_t num_experts,
                            int64_t timeout_us, bool use_fp8);
    at::Tensor combine(const at::Tensor& x, const at::Tensor& src_info,
                       const at::Tensor& layout_range, const at::Tensor& topk_idx,
                       const at::Tensor& topk_weights, const at::Tensor& active_ranks,
                       int64_t max_tokens, int64_t num_experts, int64_t timeout_us,
                       const std::optional<at::Tensor>& out);
    std::optional<std::pair<int32_t, int32_t>> takeError(bool wait);

private:
    EpGroupArgs groupArgs(const at::Tensor& active_ranks, int64_t max_tokens, int64_t num_experts,
                          int64_t timeout_us) const;

    std::unique_ptr<NcclEpTransport> transport_;
    std::unique_ptr<ErrorWord> error_;
    bool destroyed_ = false;
};

}  // namespace mooncake::ep
