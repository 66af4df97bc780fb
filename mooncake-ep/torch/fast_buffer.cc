#include "mooncake-ep/torch/fast_buffer.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "mooncake-pg/torch/store_adapter.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"

namespace mooncake::ep {

FastBuffer::FastBuffer(const c10::intrusive_ptr<c10d::Store>& store, FastBufferOptions options)
    : options_(std::move(options)) {
    if (options_.num_ranks < 1 || options_.rank < 0 || options_.rank >= options_.num_ranks)
        throw std::invalid_argument("Mooncake EP fast path: rank " + std::to_string(options_.rank) +
                                    " of " + std::to_string(options_.num_ranks) +
                                    " ranks, expected 0 <= rank < num_ranks");
    if (options_.ranks_per_device < 1 || options_.ranks_per_device > options_.num_ranks)
        throw std::invalid_argument(
            "Mooncake EP fast path: ranks_per_device=" + std::to_string(options_.ranks_per_device) +
            ", expected in [1, num_ranks = " + std::to_string(options_.num_ranks) + "]");
    if (options_.num_bytes < kEpStateBytes)
        throw std::invalid_argument(
            "Mooncake EP fast path: num_ep_buffer_bytes=" + std::to_string(options_.num_bytes) +
            ", expected at least " + std::to_string(kEpStateBytes));
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(options_.device));
    te::EngineOptions eo;
    store_ = pg::C10dStoreAdapter::ownConnection(store);
    eo.store = store_;
    eo.segment_name = "ep" + std::to_string(options_.rank);
    eo.secret = options_.secret;
    eo.key_prefix = options_.key_prefix + "te";
    eo.open_timeout_ms = options_.timeout_ms;
    engine_ = std::make_unique<te::TransferEngine>(eo);
    Status st = engine_->init("127.0.0.1", {});
    if (!st.ok())
        raiseStatus(st, "starting the transfer engine");
    auto mem =
        engine_->allocateDeviceMemory(static_cast<size_t>(options_.num_bytes), options_.device);
    if (!mem.ok())
        raiseStatus(mem.status(),
                    "allocating " + std::to_string(options_.num_bytes) +
                        " bytes of device memory on cuda:" + std::to_string(options_.device));
    buffer_ = mem.value();
    // Sequence numbers and signals start at zero; peers write here only after
    // the caller's meeting that follows connect().
    cudaCheck(cudaMemset(buffer_, 0, static_cast<size_t>(options_.num_bytes)),
              "zeroing the buffer");
    cudaCheck(cudaDeviceSynchronize(), "zeroing the buffer");
    error_ = std::make_unique<ErrorWord>(/*mirrored=*/true);
}

FastBuffer::~FastBuffer() {
    // Our kernels may still be reading peers' mappings the engine unmaps.
    (void)cudaDeviceSynchronize();
    error_.reset();
    ibgda_.reset();
    ibgda_owner_.reset();  // unmaps its queues, deregisters the buffer
    peer_table_ = at::Tensor();
    if (store_)
        store_->skipRemoves();
    if (engine_) {
        if (buffer_)
            (void)engine_->freeSharedMemory(buffer_);
        engine_->shutdown();
    }
}

int64_t FastBuffer::localAddress() const {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(buffer_));
}

void FastBuffer::connect(const std::vector<int64_t>& peer_addresses, const std::vector<bool>& p2p) {
    const int n = options_.num_ranks;
    if (static_cast<int>(peer_addresses.size()) != n)
        throw std::invalid_argument(
            "Mooncake EP fast path: " + std::to_string(peer_addresses.size()) +
            " peer addresses, expected num_ranks=" + std::to_string(n));
    if (!p2p.empty() && static_cast<int>(p2p.size()) != n)
        throw std::invalid_argument("Mooncake EP fast path: " + std::to_string(p2p.size()) +
                                    " p2p flags, expected num_ranks=" + std::to_string(n));
    const Deadline deadline = Deadline::afterMs(options_.timeout_ms);
    std::vector<int64_t> table(n, 0);
    remote_peers_.clear();
    for (int p = 0; p < n; ++p) {
        if (p == options_.rank) {
            table[p] = localAddress();
            continue;
        }
        if (!p2p.empty() && !p2p[p]) {
            remote_peers_.push_back(p);
            continue;
        }
        const std::string name = "ep" + std::to_string(p);
        auto id = engine_->openSegment(name, deadline);
        if (!id.ok())
            raiseStatus(id.status(), "opening rank " + std::to_string(p) + "'s segment");
        auto mapped = engine_->mapRemote(id.value(), static_cast<uint64_t>(peer_addresses[p]),
                                         static_cast<uint64_t>(options_.num_bytes));
        if (!mapped.ok())
            raiseStatus(mapped.status(), "mapping rank " + std::to_string(p) + "'s EP buffer");
        table[p] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(mapped.value()));
    }
    peer_table_ = at::tensor(table, at::TensorOptions().dtype(at::kLong))
                      .to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(options_.device)));
    cudaCheck(cudaDeviceSynchronize(), "uploading the peer table");
    connected_ = true;
}

void FastBuffer::useIbgda(std::shared_ptr<void> owner, const IbgdaEpDevice& device) {
    if (!connected_)
        throw std::runtime_error("Mooncake EP fast path: useIbgda before connect");
    ibgda_owner_ = std::move(owner);
    ibgda_ = device;
    ibgda_shape_.reset();
}

void FastBuffer::pinIbgdaShape(const EpGroupArgs& g) {
    if (ibgda_ && !ibgda_shape_)
        ibgda_shape_ = std::array<int64_t, 3>{g.num_experts, g.max_tokens, g.hidden};
}

EpGroupArgs FastBuffer::groupArgs(const at::Tensor& active_ranks, int64_t max_tokens,
                                  int64_t num_experts, int64_t hidden, int64_t timeout_us) const {
    if (!connected_)
        throw std::runtime_error("Mooncake EP fast path: the buffer is not connected to its peers");
    if (!remote_peers_.empty() && !ibgda_)
        throw std::runtime_error("Mooncake EP fast path: " + std::to_string(remote_peers_.size()) +
                                 " peers are not mapped over cuda_ipc and no IBGDA link is "
                                 "attached to reach them");
    if (ibgda_shape_) {
        const std::array<int64_t, 3> shape{num_experts, max_tokens, hidden};
        if (*ibgda_shape_ != shape)
            throw std::invalid_argument(
                "Mooncake EP fast path over IBGDA: this Buffer's layout is fixed by its first "
                "op (num_experts=" +
                std::to_string((*ibgda_shape_)[0]) +
                ", num_max_dispatch_tokens_per_rank=" + std::to_string((*ibgda_shape_)[1]) +
                ", hidden=" + std::to_string((*ibgda_shape_)[2]) +
                "); got num_experts=" + std::to_string(num_experts) +
                ", num_max_dispatch_tokens_per_rank=" + std::to_string(max_tokens) +
                ", hidden=" + std::to_string(hidden) + ". Build another Buffer for another shape");
    }
    EpGroupArgs g;
    g.rank = options_.rank;
    g.num_ranks = options_.num_ranks;
    g.num_experts = static_cast<int>(num_experts);
    g.max_tokens = static_cast<int>(max_tokens);
    g.hidden = static_cast<int>(hidden);
    g.local_buffer = buffer_;
    g.local_buffer_bytes = static_cast<uint64_t>(options_.num_bytes);
    g.peer_buffers = static_cast<void* const*>(peer_table_.data_ptr());
    g.active_ranks = active_ranks.data_ptr<int32_t>();
    g.timeout_ns = timeout_us < 0 ? -1 : timeout_us * 1000;
    g.ranks_per_device = options_.ranks_per_device;
    if (phase_trace_.defined())
        g.phase_trace = static_cast<uint64_t*>(phase_trace_.data_ptr());
    g.error_mirror = error_->mirror();
    return g;
}

void FastBuffer::refuseTracedCapture(const EpGroupArgs& g, cudaStream_t stream) const {
    if (g.phase_trace == nullptr)
        return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(stream, &capture), "checking the stream for a capture");
    // A replay would write to the trace after set_phase_trace let it go.
    if (capture != cudaStreamCaptureStatusNone)
        throw std::invalid_argument(
            "Mooncake EP fast path: an op traced by set_phase_trace cannot be captured in a CUDA "
            "graph; call set_phase_trace(None) before capturing");
}

DispatchResult FastBuffer::dispatch(const at::Tensor& x, const at::Tensor& topk_idx,
                                    const at::Tensor& active_ranks, int64_t max_tokens,
                                    int64_t num_experts, int64_t timeout_us, bool use_fp8) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t hidden = x.size(1);
    const EpGroupArgs g = groupArgs(active_ranks, max_tokens, num_experts, hidden, timeout_us);
    DispatchArgs a;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
    const EpLayout L = epLayoutOf(g);
    // Direct dispatch (core/direct_slots.h): the slot this op's outputs are
    // views of, and the one it names for the next op.
    const bool direct = direct_group_ && !ibgda_ && options_.num_bytes >= L.directTotalBytes();
    const EpDirectSlots::Choice slots =
        direct_slots_.choose(direct, use_fp8, direct && streamCapturing(stream));
    DispatchResult r = slots.out >= 0 ? directDispatchViews(x, topk_idx, L, slots.out, &a)
                                      : prepareDispatch(x, topk_idx, options_.num_ranks, max_tokens,
                                                        num_experts, use_fp8, &a);
    a.direct = direct;
    a.direct_slot = slots.out;
    a.next_slot = slots.next;
    refuseTracedCapture(g, stream);
    Status st = ibgda_ ? launchIbgdaDispatch(*ibgda_, g, a, stream) : launchDispatch(g, a, stream);
    if (!st.ok())
        raiseStatus(st, "dispatch");
    direct_slots_.launched(slots);
    pinIbgdaShape(g);
    error_->record(epState(buffer_), stream);
    return r;
}

DispatchResult FastBuffer::directDispatchViews(const at::Tensor& x, const at::Tensor& topk_idx,
                                               const EpLayout& L, int slot, DispatchArgs* a) {
    DispatchResult r = prepareDispatch(x, topk_idx, L.num_ranks, L.max_tokens, L.num_experts,
                                       /*use_fp8=*/true, a, /*allocate_rows=*/false);
    char* base = static_cast<char*>(buffer_);
    const auto on = x.options();
    const int64_t nle = L.numLocalExperts(), cap = L.capacity();
    // The views hold the slot (it is named again only once all are freed)
    // and this buffer, whose memory they are.
    const std::shared_ptr<FastBuffer> keep = weak_from_this().lock();
    const std::shared_ptr<void> token = direct_slots_.hold(slot);
    const auto view = [&](int64_t offset, at::IntArrayRef sizes, at::ScalarType dtype) {
        return at::from_blob(
            base + offset, sizes, [keep, token](void*) {}, on.dtype(dtype));
    };
    r.recv_x = view(L.directDataOffset(slot), {nle, cap, L.hidden}, at::kFloat8_e4m3fn);
    r.recv_scales =
        view(L.directScalesOffset(slot), {nle, cap, L.hidden / kEpHiddenAlign}, at::kFloat);
    r.src_info = view(L.directSrcOffset(slot), {nle, cap}, at::kInt);
    a->packed_recv_x = r.recv_x.data_ptr();
    a->packed_recv_scales = r.recv_scales.data_ptr<float>();
    a->src_info = r.src_info.data_ptr<int32_t>();
    return r;
}

at::Tensor FastBuffer::combine(const at::Tensor& x, const at::Tensor& src_info,
                               const at::Tensor& layout_range, const at::Tensor& topk_idx,
                               const at::Tensor& topk_weights, const at::Tensor& active_ranks,
                               int64_t max_tokens, int64_t num_experts, int64_t timeout_us,
                               const std::optional<at::Tensor>& out) {
    c10::cuda::CUDAGuard guard(x.device());
    const int64_t hidden = x.size(2);
    const EpGroupArgs g = groupArgs(active_ranks, max_tokens, num_experts, hidden, timeout_us);
    CombineArgs a;
    at::Tensor result = prepareCombine(x, src_info, layout_range, topk_idx, topk_weights, out, &a);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
    refuseTracedCapture(g, stream);
    Status st = ibgda_ ? launchIbgdaCombine(*ibgda_, g, a, stream) : launchCombine(g, a, stream);
    if (!st.ok())
        raiseStatus(st, "combine");
    pinIbgdaShape(g);
    error_->record(epState(buffer_), stream);
    return result;
}

void FastBuffer::setPhaseTrace(const std::optional<at::Tensor>& trace) {
    if (phase_trace_.defined()) {
        // Kernels queued on any stream may still write to the one set now.
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(options_.device));
        cudaCheck(cudaDeviceSynchronize(), "waiting for the traced kernels");
    }
    if (!trace) {
        phase_trace_ = at::Tensor();
        return;
    }
    const at::Tensor& t = *trace;
    const bool on_device = t.is_cuda() && t.device().index() == options_.device;
    if (t.scalar_type() != at::kLong || !on_device || !t.is_contiguous() ||
        t.numel() < kEpTraceSlots)
        throw std::invalid_argument("Mooncake EP fast path: phase trace of dtype torch." +
                                    c10::getDtypeNames(t.scalar_type()).first + " on " +
                                    t.device().str() + " with " + std::to_string(t.numel()) +
                                    " elements" + (t.is_contiguous() ? "" : " (not contiguous)") +
                                    ", expected a contiguous int64 tensor of at least " +
                                    std::to_string(kEpTraceSlots) +
                                    " elements on cuda:" + std::to_string(options_.device));
    phase_trace_ = t;
}

std::optional<std::pair<int32_t, int32_t>> FastBuffer::takeError(bool wait) {
    return error_->take(epState(buffer_), options_.device, wait);
}

}  // namespace mooncake::ep
