// The ep_<torch version> Python module: the fast-path `Buffer` that
// python/mooncake/mooncake_ep_buffer.py drives (argument checks, handles and
// events stay in Python) and the buffer size formula of the kernels' layout.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "mooncake-ep/torch/fast_buffer.h"

namespace py = pybind11;

namespace mooncake::ep {
namespace {

py::tuple dispatchResult(const DispatchResult& r) {
    py::object scales = r.recv_scales.defined() ? py::cast(r.recv_scales) : py::none();
    return py::make_tuple(r.recv_x, scales, r.recv_count, r.src_info, r.layout_range);
}

}  // namespace
}  // namespace mooncake::ep

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using mooncake::ep::FastBuffer;
    using mooncake::ep::FastBufferOptions;
    m.doc() = "Mooncake EP fast path (CUDA kernels over cuda_ipc-mapped peer buffers)";
    m.attr("TORCH_VERSION") = MOONCAKE_TORCH_VERSION;
    m.def(
        "buffer_size_hint",
        [](int64_t max_tokens, int64_t hidden, int64_t num_ranks, int64_t num_experts) {
            return mooncake::ep::epBufferSizeHint(max_tokens, hidden, num_ranks, num_experts);
        },
        py::arg("num_max_dispatch_tokens_per_rank"), py::arg("hidden"), py::arg("num_ranks"),
        py::arg("num_experts"));
    py::class_<FastBuffer>(m, "Buffer")
        .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, std::string key_prefix,
                         std::string secret, int rank, int num_ranks, int64_t num_bytes, int device,
                         int64_t timeout_ms) {
                 FastBufferOptions o;
                 o.rank = rank;
                 o.num_ranks = num_ranks;
                 o.num_bytes = num_bytes;
                 o.device = device;
                 o.key_prefix = std::move(key_prefix);
                 o.secret = std::move(secret);
                 o.timeout_ms = timeout_ms;
                 py::gil_scoped_release no_gil;
                 return std::make_unique<FastBuffer>(store, std::move(o));
             }),
             py::arg("store"), py::arg("key_prefix"), py::arg("secret"), py::arg("rank"),
             py::arg("num_ranks"), py::arg("num_bytes"), py::arg("device"), py::arg("timeout_ms"))
        .def("local_address", &FastBuffer::localAddress)
        .def("connect", &FastBuffer::connect, py::arg("peer_addresses"),
             py::call_guard<py::gil_scoped_release>())
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
        .def("take_error", &FastBuffer::takeError, py::arg("wait") = false);
}
