// The pg_<torch version> Python module: MooncakeBackendOptions, the
// backend creator, and the module-level helpers that python/mooncake/pg.py
// re-exports. Our classes derive from torch's own bindings (ProcessGroup,
// Backend, Work, Backend.Options), so objects torch hands back to Python
// (dist.group.WORLD, async Works, _get_backend) come out as our subclasses.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/engine_bindings.h"
#include "mooncake-pg/torch/options.h"
#include "mooncake-pg/torch/process_group.h"
#include "mooncake-pg/torch/work.h"

namespace py = pybind11;

namespace mooncake::pg {
namespace {

c10::intrusive_ptr<MooncakeBackendOptions> makeOptions(std::optional<at::Tensor> active_ranks,
                                                       std::optional<int64_t> max_group_size,
                                                       bool is_extension,
                                                       bool auto_deactivate_on_failure,
                                                       bool auto_sync_on_failure) {
    if (max_group_size.has_value()) {
        TORCH_CHECK_VALUE(*max_group_size >= 1,
                          "MooncakeBackendOptions: max_group_size=", *max_group_size,
                          " must be at least 1");
    }
    auto o = c10::make_intrusive<MooncakeBackendOptions>();
    o->active_ranks = std::move(active_ranks);
    o->max_group_size = max_group_size.value_or(0);
    o->is_extension = is_extension;
    o->auto_deactivate_on_failure = auto_deactivate_on_failure;
    o->auto_sync_on_failure = auto_sync_on_failure;
    o->validate();
    return o;
}

// The MooncakeBackend behind a group-like Python object: a Mooncake process
// group (dist.group.WORLD, new_group()), or the backend itself (_get_backend).
c10::intrusive_ptr<MooncakeBackend> backendOf(const py::handle& group, const char* fn) {
    if (py::isinstance<MooncakeProcessGroup>(group)) {
        return group.cast<c10::intrusive_ptr<MooncakeProcessGroup>>()->mooncakeBackend();
    }
    if (py::isinstance<MooncakeBackend>(group)) {
        return group.cast<c10::intrusive_ptr<MooncakeBackend>>();
    }
    if (py::isinstance<c10d::ProcessGroup>(group)) {
        // A group of several backends ("cpu:mooncake-cpu,cuda:nccl") holds
        // ours for one device type.
        auto pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
        for (const c10::Device& device : pg->getDeviceTypes()) {
            auto b =
                c10::dynamic_intrusive_pointer_cast<MooncakeBackend>(pg->getBackend(device.type()));
            if (b)
                return b;
        }
    }
    throw py::type_error(std::string("mooncake.pg.") + fn +
                         ": expected a Mooncake process group (e.g. dist.group.WORLD after "
                         "init_process_group(backend='mooncake-cpu')), got " +
                         py::str(py::type::handle_of(group)).cast<std::string>());
}

// Binds `name`(group): the no-argument `query` of the backend behind `group`
// (the counters tests read).
template <typename Result>
void defBackendQuery(py::module_& m, const char* name, Result (MooncakeBackend::*query)() const,
                     const char* doc) {
    m.def(
        name,
        [name, query](const py::handle& group) { return (backendOf(group, name).get()->*query)(); },
        py::arg("group"), doc);
}

}  // namespace
}  // namespace mooncake::pg

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    using namespace mooncake::pg;
    m.doc() = "Mooncake PG: the torch.distributed backends 'mooncake-cpu' and 'mooncake'";
    // Our classes derive from these bindings; they must be registered first.
    py::module_::import("torch._C._distributed_c10d");

    py::class_<MooncakeBackendOptions, c10::intrusive_ptr<MooncakeBackendOptions>,
               c10d::Backend::Options>(m, "MooncakeBackendOptions", R"(
Options for init_process_group(backend='mooncake-cpu' | 'mooncake', pg_options=...).

Forms (seed API):
    MooncakeBackendOptions(max_group_size)
    MooncakeBackendOptions(max_group_size, is_extension)
    MooncakeBackendOptions(max_group_size, is_extension,
                           auto_deactivate_on_failure, auto_sync_on_failure)
    MooncakeBackendOptions(active_ranks)
    MooncakeBackendOptions(active_ranks, is_extension)
    MooncakeBackendOptions(active_ranks, is_extension, max_group_size)  # or max_world_size=
)")
        // Tensor forms first: a one-element integer tensor would also
        // convert to an int through __index__.
        .def(py::init([](at::Tensor active_ranks, bool is_extension,
                         std::optional<int64_t> max_group_size, bool auto_deactivate_on_failure,
                         bool auto_sync_on_failure) {
                 return makeOptions(std::move(active_ranks), max_group_size, is_extension,
                                    auto_deactivate_on_failure, auto_sync_on_failure);
             }),
             py::arg("active_ranks"), py::arg("is_extension") = false,
             py::arg("max_group_size") = py::none(), py::arg("auto_deactivate_on_failure") = true,
             py::arg("auto_sync_on_failure") = true)
        .def(py::init([](at::Tensor active_ranks, bool is_extension, int64_t max_world_size) {
                 return makeOptions(std::move(active_ranks), max_world_size, is_extension, true,
                                    true);
             }),
             py::arg("active_ranks"), py::arg("is_extension"), py::arg("max_world_size"))
        .def(py::init([](std::optional<int64_t> max_group_size, bool is_extension,
                         bool auto_deactivate_on_failure, bool auto_sync_on_failure,
                         std::optional<at::Tensor> active_ranks) {
                 return makeOptions(std::move(active_ranks), max_group_size, is_extension,
                                    auto_deactivate_on_failure, auto_sync_on_failure);
             }),
             py::arg("max_group_size") = py::none(), py::arg("is_extension") = false,
             py::arg("auto_deactivate_on_failure") = true, py::arg("auto_sync_on_failure") = true,
             py::arg("active_ranks") = py::none())
        .def_property_readonly(
            "max_group_size",
            [](const MooncakeBackendOptions& o) -> std::optional<int64_t> {
                if (o.max_group_size > 0)
                    return o.max_group_size;
                if (o.active_ranks)
                    return o.active_ranks->numel();
                return std::nullopt;
            },
            "Rank slots reserved for the group (None: the group size at creation).")
        .def_property_readonly("is_extension",
                               [](const MooncakeBackendOptions& o) { return o.is_extension; })
        .def_property_readonly(
            "auto_deactivate_on_failure",
            [](const MooncakeBackendOptions& o) { return o.auto_deactivate_on_failure; })
        .def_property_readonly(
            "auto_sync_on_failure",
            [](const MooncakeBackendOptions& o) { return o.auto_sync_on_failure; })
        .def_property_readonly("active_ranks",
                               [](const MooncakeBackendOptions& o) { return o.active_ranks; })
        .def("__repr__", [](const MooncakeBackendOptions& o) { return o.toString(); });

    py::class_<MooncakeWork, c10::intrusive_ptr<MooncakeWork>, c10d::Work>(m, "MooncakeWork")
        // torch's Work.exception() binding cannot convert std::exception_ptr.
        .def(
            "exception",
            [](const MooncakeWork& work) -> py::object {
                if (!work.exception())
                    return py::none();
                return py::module_::import("torch.distributed")
                    .attr("DistBackendError")(work.errorMessage());
            },
            "None, or the failure as a torch.distributed.DistBackendError (not raised).")
        .def("local_success", &MooncakeWork::localSuccess,
             "Whether the op completed every transfer at this rank (False while pending).")
        .def("failed_ranks_hint", &MooncakeWork::failedRanksHint,
             "int32 CPU tensor with one entry per rank slot; 1 where the failure evidence "
             "names the rank. Evidence, not a verdict.");

    py::class_<MooncakeBackend, c10::intrusive_ptr<MooncakeBackend>, c10d::Backend>(
        m, "MooncakeBackend")
        .def_property_readonly(
            "timeout",
            [](const MooncakeBackend& b) {
                return py::module_::import("datetime")
                    .attr("timedelta")(py::arg("milliseconds") = b.timeoutMs());
            },
            "The timeout later ops run under (init's timeout=, MC_PG_TIMEOUT_MS, or "
            "set_timeout()), as a datetime.timedelta.");

    py::class_<MooncakeProcessGroup, c10::intrusive_ptr<MooncakeProcessGroup>, c10d::ProcessGroup>(
        m, "MooncakeProcessGroup")
        .def_property_readonly("max_group_size", [](const MooncakeProcessGroup& pg) {
            return pg.mooncakeBackend()->maxGroupSize();
        });

    m.def(
        "createMooncakeBackend",
        [](const c10d::DistributedBackendOptions& dist_options, const py::object& pg_options,
           bool is_cuda) {
            c10::intrusive_ptr<MooncakeBackendOptions> options;
            if (!pg_options.is_none()) {
                if (!py::isinstance<MooncakeBackendOptions>(pg_options)) {
                    throw py::type_error(
                        "Mooncake PG: pg_options must be mooncake.pg.MooncakeBackendOptions or "
                        "None, got " +
                        py::str(py::type::handle_of(pg_options)).cast<std::string>());
                }
                options = pg_options.cast<c10::intrusive_ptr<MooncakeBackendOptions>>();
            }
            // Bootstrap waits on peers through the store; other threads
            // (a Python store, Future callbacks) may need the GIL meanwhile.
            py::gil_scoped_release no_gil;
            return createMooncakeProcessGroup(dist_options, options, is_cuda);
        },
        py::arg("dist_backend_opts"), py::arg("pg_options"), py::arg("is_cuda"),
        "The torch.distributed extended-API creator; returns the group's ProcessGroup.");

    defineEngineBindings(m);

    m.def("set_host_ip", &setHostIp, py::arg("host_ip"),
          "Address the backend's listeners bind to, for groups created afterwards "
          "(default: $MC_HOST_IP or 127.0.0.1).");
    m.def("set_device_filter", &setDeviceFilter, py::arg("filters"),
          "NIC/HCA names the transfer engine may use, for groups created afterwards.");
    // Membership calls. Blocking ones release the GIL: the worker may need
    // it to complete Futures while they wait.
    using ms = std::chrono::milliseconds;
    auto timeoutOf = [](std::optional<double> seconds, int64_t fallback_ms) {
        if (!seconds.has_value())
            return ms(fallback_ms);
        TORCH_CHECK_VALUE(*seconds > 0, "mooncake.pg: timeout must be positive, got ", *seconds);
        return ms(static_cast<int64_t>(*seconds * 1000.0));
    };
    m.def(
        "join_group",
        [timeoutOf](const py::handle& group, std::optional<double> timeout) {
            auto b = backendOf(group, "join_group");
            py::gil_scoped_release no_gil;
            b->joinGroup(timeoutOf(timeout, 600000));
        },
        py::arg("backend"), py::arg("timeout") = py::none());
    m.def(
        "activate_ranks",
        [timeoutOf](const py::handle& group, const std::vector<int64_t>& ranks,
                    std::optional<double> timeout) {
            auto b = backendOf(group, "activate_ranks");
            py::gil_scoped_release no_gil;
            b->activateRanks(ranks, timeoutOf(timeout, 60000));
        },
        py::arg("backend"), py::arg("ranks"), py::arg("timeout") = py::none());
    m.def(
        "deactivate_ranks",
        [timeoutOf](const py::handle& group, const std::vector<int64_t>& ranks,
                    std::optional<double> timeout) {
            auto b = backendOf(group, "deactivate_ranks");
            py::gil_scoped_release no_gil;
            b->deactivateRanks(ranks, timeoutOf(timeout, 60000));
        },
        py::arg("backend"), py::arg("ranks"), py::arg("timeout") = py::none());
    m.def(
        "sync_after_failure",
        [](const py::handle& group) {
            auto b = backendOf(group, "sync_after_failure");
            py::gil_scoped_release no_gil;
            b->syncAfterFailure();
        },
        py::arg("backend"));
    m.def(
        "get_peer_state",
        [](const py::handle& group, const std::vector<int64_t>& ranks) {
            return backendOf(group, "get_peer_state")->peerState(ranks);
        },
        py::arg("backend"), py::arg("ranks"));
    m.def(
        "get_num_synced_ranks",
        [](const py::handle& group) {
            return backendOf(group, "get_num_synced_ranks")->numSyncedRanks();
        },
        py::arg("backend"));
    m.def(
        "extend_group_size_to",
        [](const py::handle& group, int64_t size) {
            backendOf(group, "extend_group_size_to")->extendGroupSizeTo(size);
        },
        py::arg("backend"), py::arg("size"));
    m.def(
        "get_preferred_hca",
        [](const py::handle& group, const std::string& location) {
            return backendOf(group, "get_preferred_hca")->preferredHca(location);
        },
        py::arg("backend"), py::arg("location") = "");
    m.def(
        "_worker_stats",
        [](const py::handle& group) {
            const MooncakeBackend::WorkerStats s = backendOf(group, "_worker_stats")->workerStats();
            py::dict d;
            d["ops"] = s.ops;
            d["queued_us"] = static_cast<double>(s.queued_ns) / 1e3;
            d["run_us"] = static_cast<double>(s.run_ns) / 1e3;
            d["caller_launched"] = s.caller_launched;
            return d;
        },
        py::arg("backend"),
        "Benchmarks: the collective worker's ops since the group began and the host time they "
        "spent queued and running (for kernel calls: until launched), in microseconds; and the "
        "synchronous kernel calls the calling thread launched itself (MC_PG_CUDA_CALLER_LAUNCH), "
        "which the worker did not run.");
    // Test seam only (MooncakeBackend::holdViewsForTest).
    m.def(
        "_test_hold_views",
        [](const py::handle& group, double bound_s) {
            backendOf(group, "_test_hold_views")
                ->holdViewsForTest(std::chrono::milliseconds(static_cast<int64_t>(bound_s * 1000)));
        },
        py::arg("backend"), py::arg("bound_s"));
    m.def(
        "_test_await_held_view",
        [](const py::handle& group, double timeout_s) {
            auto b = backendOf(group, "_test_await_held_view");
            py::gil_scoped_release no_gil;
            return b->awaitHeldViewForTest(
                std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        },
        py::arg("backend"), py::arg("timeout_s"));
    m.def(
        "_test_release_views",
        [](const py::handle& group) {
            backendOf(group, "_test_release_views")->releaseViewsForTest();
        },
        py::arg("backend"));
    m.def(
        "backend_of", [](const py::handle& group) { return backendOf(group, "backend_of"); },
        py::arg("group"), "The MooncakeBackend behind a Mooncake process group.");
    defBackendQuery(
        m, "_device_collective_calls", &MooncakeBackend::deviceCollectiveCalls,
        "How many collectives of the group ran on the device kernels (MC_PG_CUDA_PATH=kernels); "
        "for tests.");
    defBackendQuery(
        m, "_direct_collective_calls", &MooncakeBackend::directCollectiveCalls,
        "How many of those read the members' own buffers (the direct path); for tests.");
    defBackendQuery(
        m, "_device_p2p_ops", &MooncakeBackend::deviceP2POps,
        "How many P2P ops on CUDA tensors of the group went over device pools; for tests.");
    defBackendQuery(
        m, "_direct_agreements_skipped", &MooncakeBackend::directAgreementsSkipped,
        "Of those, how many skipped the agreement exchange (every member had mapped the same "
        "offers before); for tests.");
    defBackendQuery(m, "_captured_collective_calls", &MooncakeBackend::capturedCollectiveCalls,
                    "How many device collectives were captured into CUDA graphs; for tests.");
    defBackendQuery(
        m, "_live_graph_calls", &MooncakeBackend::liveGraphCalls,
        "Of the captured device collectives, how many sit in CUDA graphs (or graph executables) "
        "not destroyed yet; for tests.");
    defBackendQuery(
        m, "_graph_watch_passes", &MooncakeBackend::graphWatchPasses,
        "How many times the idle worker watched for replays of captured calls; for tests.");
    defBackendQuery(
        m, "_graph_watch_idle", &MooncakeBackend::graphWatchIdle,
        "True once no CUDA graph holds a captured call and the worker made its last watch "
        "pass; for tests.");
    defBackendQuery(
        m, "_graph_failures_reported", &MooncakeBackend::graphFailuresReported,
        "How many failed CUDA graph replays were reported to the control plane as failure "
        "evidence; for tests.");
    m.def(
        "check_graph_replays",
        [](const py::handle& group) {
            backendOf(group, "check_graph_replays")->checkGraphReplays();
        },
        py::arg("backend"),
        "Raises the first failure of a collective replayed from a CUDA graph since the last "
        "check (a membership change after the capture, a peer that did not signal in time, an "
        "abort) and clears it; returns None when there was none.");
    m.def(
        "get_active_ranks",
        [](const py::handle& group) { return backendOf(group, "get_active_ranks")->activeRanks(); },
        py::arg("backend"),
        "The group's active-rank mask: int32, one entry per rank slot (max_group_size), 1 for "
        "active ranks.");
}
