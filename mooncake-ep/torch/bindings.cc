// The ep_<torch version> Python module: the fast-path `Buffer` that
// python/mooncake/mooncake_ep_buffer.py drives (argument checks, handles and
// events stay in Python) and the buffer size formula of the kernels' layout.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "mooncake-ep/torch/ep_ops.h"
#include "mooncake-ep/torch/fast_buffer.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#ifdef MOONCAKE_EP_NCCL_DEVICE
#include "mooncake-ep/torch/nccl/nccl_buffer.h"
#endif

namespace py = pybind11;

namespace mooncake::ep {
#ifdef MOONCAKE_EP_IBGDA
void bindIbgda(py::module_& m);  // ibgda_bindings.cc
#endif
namespace {

py::tuple dispatchResult(const DispatchResult& r) {
    py::object scales = r.recv_scales.defined() ? py::cast(r.recv_scales) : py::none();
    return py::make_tuple(r.recv_x, scales, r.recv_count, r.src_info, r.layout_range);
}

#ifdef MOONCAKE_EP_NCCL_DEVICE
// The NCCL device-API transport (USE_NCCL_DEVICE=ON builds only).
void bindNccl(py::module_& m) {
    m.attr("NCCL_DEVICE_VERSION") = ncclEpBuiltVersion();
    // (num_rdma_ranks, num_nvlink_ranks) the kernels are built for: the hybrid
    // kernels take any shape; these are the ones ElasticBuffer selects NCCL for.
    m.attr("NCCL_SHAPES") =
        py::make_tuple(py::make_tuple(1, 2), py::make_tuple(1, 8), py::make_tuple(2, 4),
                       py::make_tuple(2, 8), py::make_tuple(4, 4));
    m.def("nccl_runtime_version", &ncclEpRuntimeVersion);
    m.def("nccl_unique_id", [] {
        std::array<char, kNcclUniqueIdBytes> id{};
        Status st = ncclEpUniqueId(&id);
        if (!st.ok())
            raiseStatus(st, "ncclGetUniqueId");
        return py::bytes(id.data(), id.size());
    });
    py::class_<NcclBuffer>(m, "NcclBuffer")
        .def(py::init([](py::bytes unique_id, int rank, int num_ranks, int device, int num_experts,
                         int max_tokens, int hidden, int64_t timeout_ms) {
                 NcclEpOptions o;
                 o.rank = rank;
                 o.num_ranks = num_ranks;
                 o.device = device;
                 o.num_experts = num_experts;
                 o.max_tokens = max_tokens;
                 o.hidden = hidden;
                 o.timeout_ms = timeout_ms;
                 std::string id = unique_id;
                 py::gil_scoped_release no_gil;
                 return std::make_unique<NcclBuffer>(id, o);
             }),
             py::arg("unique_id"), py::arg("rank"), py::arg("num_ranks"), py::arg("device"),
             py::arg("num_experts"), py::arg("max_tokens"), py::arg("hidden"),
             py::arg("timeout_ms"))
        .def("window_bytes", &NcclBuffer::windowBytes)
        .def("lsa_size", &NcclBuffer::lsaSize)
        .def("destroy", &NcclBuffer::destroy, py::call_guard<py::gil_scoped_release>())
        .def(
            "dispatch",
            [](NcclBuffer& b, const at::Tensor& x, const at::Tensor& topk_idx,
               const at::Tensor& active_ranks, int64_t max_tokens, int64_t num_experts,
               int64_t timeout_us, bool use_fp8) {
                return dispatchResult(b.dispatch(x, topk_idx, active_ranks, max_tokens, num_experts,
                                                 timeout_us, use_fp8));
            },
            py::arg("x"), py::arg("topk_idx"), py::arg("active_ranks"), py::arg("max_tokens"),
            py::arg("num_experts"), py::arg("timeout_us"), py::arg("use_fp8"))
        .def("combine", &NcclBuffer::combine, py::arg("x"), py::arg("src_info"),
             py::arg("layout_range"), py::arg("topk_idx"), py::arg("topk_weights"),
             py::arg("active_ranks"), py::arg("max_tokens"), py::arg("num_experts"),
             py::arg("timeout_us"), py::arg("out"))
        .def("take_error", &NcclBuffer::takeError, py::arg("wait") = false);
}
#else
void bindNccl(py::module_& m) {
    m.attr("NCCL_DEVICE_VERSION") = 0;  // built without USE_NCCL_DEVICE
    m.attr("NCCL_SHAPES") = py::tuple();
}
#endif

}  // namespace
}  // namespace mooncake::ep

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using mooncake::ep::FastBuffer;
    using mooncake::ep::FastBufferOptions;
    m.doc() = "Mooncake EP fast path (CUDA kernels over cuda_ipc-mapped peer buffers)";
    m.attr("TORCH_VERSION") = MOONCAKE_TORCH_VERSION;
    m.def(
        "buffer_size_hint",
        [](int64_t max_tokens, int64_t hidden, int64_t num_ranks, int64_t num_experts,
           bool direct) {
            // `direct`: with the direct FP8 dispatch's area (MC_EP_DIRECT_DISPATCH).
            if (direct)
                return mooncake::ep::EpLayout{num_ranks, num_experts, max_tokens, hidden}
                    .directTotalBytes();
            return mooncake::ep::epBufferSizeHint(max_tokens, hidden, num_ranks, num_experts);
        },
        py::arg("num_max_dispatch_tokens_per_rank"), py::arg("hidden"), py::arg("num_ranks"),
        py::arg("num_experts"), py::arg("direct") = false);
    m.def(
        "ibgda_status",
        [](const std::vector<std::string>& device_filter) {
            mooncake::te::RdmaOptions o;
            o.device_filter = device_filter;
            const mooncake::te::IbgdaProbe p = mooncake::te::probeIbgda(o);
            return py::make_tuple(p.device, p.status.ok() ? "" : p.status.message());
        },
        py::arg("device_filter"),
        "(device, reason): the first IBGDA-capable device the filter admits, or \"\" and why "
        "there is none");
    m.def("aligned_pad", &mooncake::ep::alignedPad, py::arg("min_us"), py::arg("period_us"),
          py::arg("busy_blocks") = 0,
          "Benchmarks: a GPU wait on the current stream of at least min_us that ends, for every "
          "process on this GPU, at the next multiple of period_us of the GPU's clock; "
          "busy_blocks > 0 waits in that many blocks of one warp polling the clock (the SMs stay "
          "active, as under load) instead of one sleeping thread");
    m.def("gpu_clock_ns", &mooncake::ep::gpuClockNs,
          "Benchmarks: the current GPU's clock (%globaltimer) in ns, read after the current "
          "stream's earlier work");
    m.def("pad_until", &mooncake::ep::padUntil, py::arg("target_ns"), py::arg("max_wait_ns"),
          py::arg("busy_blocks") = 0,
          "Benchmarks: a GPU wait on the current stream until the GPU's clock reaches target_ns "
          "(from gpu_clock_ns), of at most max_wait_ns; processes on one GPU that agree on the "
          "target start what follows together; busy_blocks as for aligned_pad");
    py::class_<FastBuffer, std::shared_ptr<FastBuffer>>(m, "Buffer")
        .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, std::string key_prefix,
                         std::string secret, int rank, int num_ranks, int64_t num_bytes, int device,
                         int64_t timeout_ms, int ranks_per_device) {
                 FastBufferOptions o;
                 o.rank = rank;
                 o.num_ranks = num_ranks;
                 o.num_bytes = num_bytes;
                 o.device = device;
                 o.key_prefix = std::move(key_prefix);
                 o.secret = std::move(secret);
                 o.timeout_ms = timeout_ms;
                 o.ranks_per_device = ranks_per_device;
                 py::gil_scoped_release no_gil;
                 return std::make_shared<FastBuffer>(store, std::move(o));
             }),
             py::arg("store"), py::arg("key_prefix"), py::arg("secret"), py::arg("rank"),
             py::arg("num_ranks"), py::arg("num_bytes"), py::arg("device"), py::arg("timeout_ms"),
             py::arg("ranks_per_device") = 1)
        .def("local_address", &FastBuffer::localAddress)
        .def("set_direct_dispatch", &FastBuffer::setDirectDispatch, py::arg("on"))
        .def("connect", &FastBuffer::connect, py::arg("peer_addresses"),
             py::arg("p2p") = std::vector<bool>{}, py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("remote_peers", &FastBuffer::remotePeers)
        .def(
            "dispatch",
            [](FastBuffer& b, const at::Tensor& x, const at::Tensor& topk_idx,
               const at::Tensor& active_ranks, int64_t max_tokens, int64_t num_experts,
               int64_t timeout_us, bool use_fp8) {
                return mooncake::ep::dispatchResult(b.dispatch(
                    x, topk_idx, active_ranks, max_tokens, num_experts, timeout_us, use_fp8));
            },
            py::arg("x"), py::arg("topk_idx"), py::arg("active_ranks"), py::arg("max_tokens"),
            py::arg("num_experts"), py::arg("timeout_us"), py::arg("use_fp8"))
        .def("combine", &FastBuffer::combine, py::arg("x"), py::arg("src_info"),
             py::arg("layout_range"), py::arg("topk_idx"), py::arg("topk_weights"),
             py::arg("active_ranks"), py::arg("max_tokens"), py::arg("num_experts"),
             py::arg("timeout_us"), py::arg("out"))
        .def("take_error", &FastBuffer::takeError, py::arg("wait") = false)
        .def("set_phase_trace", &FastBuffer::setPhaseTrace, py::arg("trace"),
             "Benchmarks: per-block timestamps of the kernels into `trace` (int64 "
             "[phase_trace_layout()['slots']] on the buffer's device) from the next op on; None "
             "stops it");
    m.def(
        "phase_trace_layout",
        [] {
            py::dict d;
            d["kernels"] = std::vector<std::string>{"dispatch_send", "dispatch_receive",
                                                    "combine_send", "combine_receive"};
            d["marks"] = std::vector<std::string>{"start", "middle", "end"};
            d["max_blocks"] = mooncake::ep::kEpTraceMaxBlocks;
            d["slots"] = mooncake::ep::kEpTraceSlots;
            return d;
        },
        "Benchmarks: the phase trace's shape, [kernels][max_blocks][marks] of int64 ns "
        "(core/phase_trace.h)");
    mooncake::ep::bindNccl(m);
#ifdef MOONCAKE_EP_IBGDA
    mooncake::ep::bindIbgda(m);
#endif
}
