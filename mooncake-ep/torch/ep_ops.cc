#include "mooncake-ep/torch/ep_ops.h"

#include "mooncake-ep/kernels/aligned_pad.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <stdexcept>

namespace mooncake::ep {
namespace {

void* dataPtr(const at::Tensor& t) {
    return t.numel() > 0 ? t.data_ptr() : nullptr;
}

}  // namespace

[[noreturn]] void raiseStatus(const Status& st, const std::string& what) {
    const std::string msg = "Mooncake EP fast path: " + what + ": " + st.message();
    if (st.code() == StatusCode::kInvalidArgument)
        throw std::invalid_argument(msg);
    throw std::runtime_error(msg);
}

void cudaCheck(cudaError_t e, const std::string& what) {
    if (e != cudaSuccess)
        throw std::runtime_error("Mooncake EP fast path: " + what + ": " + cudaGetErrorString(e));
}

bool streamCapturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
}

DispatchResult prepareDispatch(const at::Tensor& x, const at::Tensor& topk_idx, int64_t num_ranks,
                               int64_t max_tokens, int64_t num_experts, bool use_fp8,
                               DispatchArgs* a, bool allocate_rows) {
    const int64_t hidden = x.size(1);
    const int64_t nle = num_experts / num_ranks;
    const int64_t cap = num_ranks * max_tokens;
    const auto on = x.options();
    DispatchResult r;
    r.recv_count = at::empty({nle}, on.dtype(at::kInt));
    r.layout_range = at::empty({nle, num_ranks}, on.dtype(at::kLong));
    a->x = dataPtr(x);
    a->topk_idx = static_cast<const int64_t*>(dataPtr(topk_idx));
    a->num_tokens = static_cast<int>(x.size(0));
    a->top_k = static_cast<int>(topk_idx.size(1));
    a->use_fp8 = use_fp8;
    a->packed_recv_count = r.recv_count.data_ptr<int32_t>();
    a->layout_range = r.layout_range.data_ptr<int64_t>();
    if (!allocate_rows)
        return r;
    r.recv_x =
        at::empty({nle, cap, hidden}, on.dtype(use_fp8 ? at::kFloat8_e4m3fn : at::kBFloat16));
    if (use_fp8)
        r.recv_scales = at::empty({nle, cap, hidden / kEpHiddenAlign}, on.dtype(at::kFloat));
    r.src_info = at::empty({nle, cap}, on.dtype(at::kInt));

    a->packed_recv_x = r.recv_x.data_ptr();
    a->packed_recv_scales = use_fp8 ? r.recv_scales.data_ptr<float>() : nullptr;
    a->src_info = r.src_info.data_ptr<int32_t>();
    return r;
}

at::Tensor prepareCombine(const at::Tensor& x, const at::Tensor& src_info,
                          const at::Tensor& layout_range, const at::Tensor& topk_idx,
                          const at::Tensor& topk_weights, const std::optional<at::Tensor>& out,
                          CombineArgs* a) {
    const int64_t hidden = x.size(2);
    at::Tensor result =
        out.has_value() ? *out
                        : at::empty({topk_idx.size(0), hidden}, x.options().dtype(at::kBFloat16));
    a->x = x.data_ptr();
    a->src_info = src_info.data_ptr<int32_t>();
    a->layout_range = layout_range.data_ptr<int64_t>();
    a->topk_idx = static_cast<const int64_t*>(dataPtr(topk_idx));
    a->topk_weights = static_cast<const float*>(dataPtr(topk_weights));
    a->num_tokens = static_cast<int>(topk_idx.size(0));
    a->top_k = static_cast<int>(topk_idx.size(1));
    a->out = dataPtr(result);
    return result;
}

ErrorWord::ErrorWord(bool mirrored) : mirrored_(mirrored) {
    void* host = nullptr;
    cudaCheck(cudaHostAlloc(&host, 2 * sizeof(int32_t), cudaHostAllocMapped), "cudaHostAlloc");
    host_ = static_cast<int32_t*>(host);
    host_[0] = host_[1] = 0;
    void* device_view = nullptr;
    cudaCheck(cudaHostGetDevicePointer(&device_view, host, 0), "cudaHostGetDevicePointer");
    device_view_ = static_cast<int32_t*>(device_view);
    cudaCheck(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
}

ErrorWord::~ErrorWord() {
    if (event_)
        (void)cudaEventDestroy(event_);
    if (host_)
        (void)cudaFreeHost(host_);
}

void ErrorWord::record(EpState* state, cudaStream_t stream) {
    if (streamCapturing(stream))
        return;  // a replayed graph's error shows after the next eager op
    // A copy queued behind the kernels costs the op a step of the stream
    // (about 10 us with several processes on one GPU); kernels that mirror
    // the words need only the event.
    if (!mirrored_) {
        cudaCheck(cudaMemcpyAsync(host_, &state->error_code, 2 * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream),
                  "copying the error word");
    }
    cudaCheck(cudaEventRecord(event_, stream), "recording the error word's event");
    pending_ = true;
}

void alignedPad(double min_us, double period_us, int64_t busy_blocks) {
    if (!(min_us >= 1.0) || !(period_us >= 1.0))
        throw std::invalid_argument("aligned_pad: min_us and period_us must be >= 1, got " +
                                    std::to_string(min_us) + " and " + std::to_string(period_us));
    // Before any CUDA call, as the other arguments are.
    const Status busy = checkPadBusyBlocks(busy_blocks);
    if (!busy.ok())
        raiseStatus(busy, "aligned_pad");
    const Status st = launchAlignedPad(
        static_cast<uint64_t>(min_us * 1000.0), static_cast<uint64_t>(period_us * 1000.0),
        at::cuda::getCurrentCUDAStream().stream(), static_cast<int>(busy_blocks));
    if (!st.ok())
        raiseStatus(st, "aligned_pad");
}

int64_t gpuClockNs() {
    const at::Tensor word = at::empty(
        {1}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA, at::cuda::current_device()));
    const Status st = launchReadGpuClock(reinterpret_cast<uint64_t*>(word.data_ptr<int64_t>()),
                                         at::cuda::getCurrentCUDAStream().stream());
    if (!st.ok())
        raiseStatus(st, "gpu_clock_ns");
    return word.item<int64_t>();
}

void padUntil(int64_t target_ns, int64_t max_wait_ns, int64_t busy_blocks) {
    if (target_ns <= 0)
        throw std::invalid_argument("pad_until: target_ns must be > 0 (a GPU clock reading), got " +
                                    std::to_string(target_ns));
    if (max_wait_ns <= 0)
        throw std::invalid_argument("pad_until: max_wait_ns must be > 0, got " +
                                    std::to_string(max_wait_ns));
    const Status busy = checkPadBusyBlocks(busy_blocks);
    if (!busy.ok())
        raiseStatus(busy, "pad_until");
    const Status st =
        launchPadUntil(static_cast<uint64_t>(target_ns), static_cast<uint64_t>(max_wait_ns),
                       at::cuda::getCurrentCUDAStream().stream(), static_cast<int>(busy_blocks));
    if (!st.ok())
        raiseStatus(st, "pad_until");
}

std::optional<std::pair<int32_t, int32_t>> ErrorWord::take(EpState* state, int device, bool wait) {
    if (!pending_)
        return std::nullopt;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    if (streamCapturing(stream))
        return std::nullopt;  // no queries inside a capture
    if (wait) {
        cudaCheck(cudaEventSynchronize(event_), "waiting for the error word");
    } else {
        const cudaError_t e = cudaEventQuery(event_);
        if (e == cudaErrorNotReady)
            return std::nullopt;
        cudaCheck(e, "querying the error word");
    }
    pending_ = false;
    const volatile int32_t* words = host_;
    if (words[0] == kEpErrorNone)
        return std::nullopt;
    const std::pair<int32_t, int32_t> err{words[0], words[1]};
    host_[0] = host_[1] = 0;
    // Every op recorded so far is complete (the event is the last one's), so
    // the device words hold nothing newer than what was read.
    cudaCheck(cudaMemsetAsync(&state->error_code, 0, 2 * sizeof(int32_t), stream),
              "clearing the error word");
    if (!mirrored_)
        record(state, stream);
    return err;
}

}  // namespace mooncake::ep
