// The IbgdaEndpoint (mooncake-ep/ibgda/endpoint.h) for Python, where
// python/mooncake/_ep_ibgda.py runs seed 000's connect() exchange over the
// Buffer's group. Built with WITH_RDMA only.
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "mooncake-ep/ibgda/endpoint.h"
#include "mooncake-ep/torch/ep_ops.h"

namespace py = pybind11;

namespace mooncake::ep {

void bindIbgda(py::module_& m) {
    using Pair = std::tuple<int64_t, int64_t>;
    auto words = [](const std::vector<Pair>& pairs) {
        std::vector<IbgdaEndpoint::Words2> out;
        for (const auto& [a, b] : pairs)
            out.push_back({a, b});
        return out;
    };
    py::class_<IbgdaEndpoint>(m, "IbgdaEndpoint")
        .def(py::init([](int rank, int num_ranks, int qps_per_rank, uint32_t wqes_per_qp,
                         uintptr_t buffer, size_t bytes, bool buffer_on_device,
                         std::vector<std::string> device_filter) {
                 IbgdaEndpointOptions o;
                 o.rank = rank;
                 o.num_ranks = num_ranks;
                 o.qps_per_rank = qps_per_rank;
                 o.wqes_per_qp = wqes_per_qp;
                 o.buffer = reinterpret_cast<void*>(buffer);
                 o.bytes = bytes;
                 o.buffer_on_device = buffer_on_device;
                 o.device_filter = std::move(device_filter);
                 auto made = IbgdaEndpoint::create(o);
                 if (!made.ok())
                     raiseStatus(made.status(), "IbgdaEndpoint");
                 return std::move(made).value();
             }),
             py::arg("rank"), py::arg("num_ranks"), py::arg("qps_per_rank"),
             py::arg("wqes_per_qp"), py::arg("buffer"), py::arg("bytes"),
             py::arg("buffer_on_device"), py::arg("device_filter") = std::vector<std::string>{})
        .def_property_readonly("qps_per_rank", &IbgdaEndpoint::qpsPerRank)
        .def_property_readonly("device", &IbgdaEndpoint::deviceName)
        .def("region_words",
             [](const IbgdaEndpoint& e) {
                 const auto w = e.regionWords();
                 return py::make_tuple(w[0], w[1]);
             })
        .def("qp_words_for", &IbgdaEndpoint::qpWordsFor, py::arg("peer"))
        .def("gid_words",
             [](const IbgdaEndpoint& e) {
                 const auto w = e.gidWords();
                 return py::make_tuple(w[0], w[1]);
             })
        .def(
            "connect",
            [words](IbgdaEndpoint& e, const std::vector<Pair>& regions,
                    const std::vector<std::vector<int64_t>>& qps_from,
                    const std::vector<Pair>& gids) {
                const Status st = e.connect(words(regions), qps_from, words(gids));
                if (!st.ok())
                    raiseStatus(st, "IbgdaEndpoint.connect");
            },
            py::arg("regions"), py::arg("qps_from"), py::arg("gids"),
            py::call_guard<py::gil_scoped_release>());
}

}  // namespace mooncake::ep
