// The IbgdaEndpoint (mooncake-ep/ibgda/endpoint.h) and the IbgdaLink that
// wraps it for a fast-path Buffer (mooncake-ep/ibgda/link.h) for Python,
// where python/mooncake/_ep_ibgda.py runs seed 000's connect() exchange over
// the Buffer's group. Built with WITH_RDMA only.
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mooncake-ep/ibgda/endpoint.h"
#include "mooncake-ep/ibgda/link.h"
#include "mooncake-ep/torch/ep_ops.h"
#include "mooncake-ep/torch/fast_buffer.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_config.h"

namespace py = pybind11;

namespace mooncake::ep {

namespace {

using Pair = std::tuple<int64_t, int64_t>;

std::vector<IbgdaEndpoint::Words2> words(const std::vector<Pair>& pairs) {
    std::vector<IbgdaEndpoint::Words2> out;
    for (const auto& [a, b] : pairs)
        out.push_back({a, b});
    return out;
}

py::tuple pair(const IbgdaEndpoint::Words2& w) {
    return py::make_tuple(w[0], w[1]);
}

// The words and connect() of seed 000's exchange, on the endpoint `get`
// returns from the bound object (the endpoint itself, or a link's).
template <typename Class, typename Get>
void bindExchange(Class& c, Get get) {
    c.def_property_readonly("qps_per_rank",
                            [get](typename Class::type& o) { return get(o).qpsPerRank(); })
        .def_property_readonly("device",
                               [get](typename Class::type& o) { return get(o).deviceName(); })
        .def("region_words", [get](typename Class::type& o) { return pair(get(o).regionWords()); })
        .def(
            "qp_words_for",
            [get](typename Class::type& o, int peer) { return get(o).qpWordsFor(peer); },
            py::arg("peer"))
        .def("gid_words", [get](typename Class::type& o) { return pair(get(o).gidWords()); })
        .def(
            "connect",
            [get](typename Class::type& o, const std::vector<Pair>& regions,
                  const std::vector<std::vector<int64_t>>& qps_from,
                  const std::vector<Pair>& gids) {
                const Status st = get(o).connect(words(regions), qps_from, words(gids));
                if (!st.ok())
                    raiseStatus(st, "IBGDA connect");
            },
            py::arg("regions"), py::arg("qps_from"), py::arg("gids"),
            py::call_guard<py::gil_scoped_release>());
}

void bindLink(py::module_& m) {
    py::class_<IbgdaLink, std::shared_ptr<IbgdaLink>> link(m, "IbgdaLink");
    link.def(py::init([](int rank, int num_ranks, uintptr_t buffer, size_t bytes,
                         std::optional<int> qps_per_rank, uint32_t wqes_per_qp,
                         bool buffer_on_device, std::vector<std::string> device_filter) {
                 IbgdaEndpointOptions o;
                 o.rank = rank;
                 o.num_ranks = num_ranks;
                 if (qps_per_rank) {
                     o.qps_per_rank = *qps_per_rank;
                 } else {
                     auto env = te::rdma::activeQpsPerRankFromEnv();
                     if (!env.ok())
                         raiseStatus(env.status(), "IbgdaLink");
                     o.qps_per_rank = env.value();
                 }
                 o.wqes_per_qp = wqes_per_qp;
                 o.buffer = reinterpret_cast<void*>(buffer);
                 o.bytes = bytes;
                 o.buffer_on_device = buffer_on_device;
                 o.device_filter = std::move(device_filter);
                 py::gil_scoped_release no_gil;
                 auto made = IbgdaLink::create(o);
                 if (!made.ok())
                     raiseStatus(made.status(), "IbgdaLink");
                 return std::shared_ptr<IbgdaLink>(std::move(made).value());
             }),
             py::arg("rank"), py::arg("num_ranks"), py::arg("buffer"), py::arg("bytes"),
             py::arg("qps_per_rank") = std::nullopt, py::arg("wqes_per_qp") = 256,
             py::arg("buffer_on_device") = true,
             py::arg("device_filter") = std::vector<std::string>{});
    bindExchange(link, [](IbgdaLink& l) -> IbgdaEndpoint& { return l.endpoint(); });
    link.def(
            "activate",
            [](IbgdaLink& l) {
                const Status st = l.activate();
                if (!st.ok())
                    raiseStatus(st, "IbgdaLink.activate");
            },
            py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("active", &IbgdaLink::active);
    m.def(
        "attach_ibgda",
        [](FastBuffer& fast, const std::shared_ptr<IbgdaLink>& l) {
            if (!l->active())
                throw std::invalid_argument("attach_ibgda: the IbgdaLink is not active yet");
            fast.useIbgda(l, l->device());
        },
        py::arg("fast"), py::arg("link"),
        "Makes the fast-path Buffer reach its peers outside the peer table through the link");
}

}  // namespace

void bindIbgda(py::module_& m) {
    bindLink(m);
    py::class_<IbgdaEndpoint> endpoint(m, "IbgdaEndpoint");
    endpoint.def(py::init([](int rank, int num_ranks, int qps_per_rank, uint32_t wqes_per_qp,
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
                 py::arg("buffer_on_device"),
                 py::arg("device_filter") = std::vector<std::string>{});
    bindExchange(endpoint, [](IbgdaEndpoint& e) -> IbgdaEndpoint& { return e; });
}

}  // namespace mooncake::ep
