// What every EP transport's torch layer does around a kernel launch: allocate
// the outputs with torch, fill the launch arguments, and watch the device
// error word. Shared by FastBuffer (cuda_ipc) and NcclBuffer (NCCL device API).
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "mooncake-ep/kernels/ep_kernels.h"

namespace mooncake::ep {

// The outputs of one dispatch (scales undefined without FP8).
struct DispatchResult {
    at::Tensor recv_x, recv_scales, recv_count, src_info, layout_range;
};

// Allocates the outputs of a dispatch of `x` and points `a` at them.
DispatchResult prepareDispatch(const at::Tensor& x, const at::Tensor& topk_idx, int64_t num_ranks,
                               int64_t max_tokens, int64_t num_experts, bool use_fp8,
                               DispatchArgs* a, bool allocate_rows = true);
// The combine result (`out`, or a new tensor) with `a` pointing at it.
at::Tensor prepareCombine(const at::Tensor& x, const at::Tensor& src_info,
                          const at::Tensor& layout_range, const at::Tensor& topk_idx,
                          const at::Tensor& topk_weights, const std::optional<at::Tensor>& out,
                          CombineArgs* a);

// Throws std::invalid_argument for kInvalidArgument, else std::runtime_error.
[[noreturn]] void raiseStatus(const Status& st, const std::string& what);
void cudaCheck(cudaError_t e, const std::string& what);
bool streamCapturing(cudaStream_t stream);

// Benchmarks: queues on the current stream a GPU wait of at least `min_us`
// that ends, for every process on this GPU, at the next multiple of
// `period_us` of its clock (kernels/aligned_pad.h); `busy_blocks` blocks of
// one warp poll the clock instead of one sleeping thread when > 0.
void alignedPad(double min_us, double period_us, int64_t busy_blocks = 0);
// Benchmarks: the current device's GPU clock in ns (synchronizes the current
// stream), and a wait on the current stream until it reaches target_ns, of
// at most max_wait_ns (kernels/aligned_pad.h).
int64_t gpuClockNs();
void padUntil(int64_t target_ns, int64_t max_wait_ns, int64_t busy_blocks = 0);

// The device error word of an EP buffer (EpState::error_code/info), mirrored
// in pinned host memory after each launch and read without blocking.
class ErrorWord {
public:
    // `mirrored`: the kernels this word serves write mirror() at the end of
    // each op (the cuda_ipc and IBGDA receives), so record() queues only an
    // event; otherwise (the NCCL transport) it copies the words behind them.
    explicit ErrorWord(bool mirrored);
    ~ErrorWord();
    ErrorWord(const ErrorWord&) = delete;
    ErrorWord& operator=(const ErrorWord&) = delete;

    // For EpGroupArgs::error_mirror: the device's view of the host words,
    // null when not mirrored.
    int32_t* mirror() const { return mirrored_ ? device_view_ : nullptr; }
    // After a launch on `stream` (skipped while the stream is captured).
    void record(EpState* state, cudaStream_t stream);
    // (EpError, value) of the last completed op, then cleared; nullopt when
    // none or while the op is in flight (unless `wait`).
    std::optional<std::pair<int32_t, int32_t>> take(EpState* state, int device, bool wait);

private:
    const bool mirrored_;
    int32_t* host_ = nullptr;         // pinned, mapped [2]: error_code, error_info
    int32_t* device_view_ = nullptr;  // host_ as kernels address it
    cudaEvent_t event_ = nullptr;
    bool pending_ = false;
};

}  // namespace mooncake::ep
