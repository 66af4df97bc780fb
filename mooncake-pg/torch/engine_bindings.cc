// mooncake.engine.TransferEngine: the transfer engine for Python users who
// move bytes themselves, and the engine pg.set_transfer_engine hands to the
// groups created afterwards. Arguments arrive as Python objects and are
// converted here, so that every error names the argument, its value and what
// was expected; engine Status codes become ValueError (bad argument),
// TimeoutError (a deadline passed) or RuntimeError (anything else).
#include "mooncake-pg/torch/engine_bindings.h"

#include <Python.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "mooncake-pg/core/shared_engine.h"
#include "mooncake-pg/torch/process_group.h"
#include "mooncake-pg/torch/store_adapter.h"
#include "mooncake-transfer-engine/common/env.h"

namespace py = pybind11;

namespace mooncake::pg {
namespace {

constexpr double kDefaultTimeoutS = 30.0;

std::string typeName(const py::handle& v) {
    return py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>();
}

[[noreturn]] void throwPy(PyObject* type, const std::string& message) {
    PyErr_SetString(type, message.c_str());
    throw py::error_already_set();
}

[[noreturn]] void raiseStatus(const Status& st, const std::string& context) {
    const std::string text = context + ": " + st.toString();
    switch (st.code()) {
        case StatusCode::kInvalidArgument:
        case StatusCode::kOutOfRange:
        case StatusCode::kNotFound:
            throwPy(PyExc_ValueError, text);
        case StatusCode::kTimeout:
            throwPy(PyExc_TimeoutError, text);
        default:
            throwPy(PyExc_RuntimeError, text);
    }
}

// A Python int (not a bool) in [min, INT64_MAX].
int64_t intArg(const py::handle& v, const char* fn, const char* name, int64_t min,
               const char* expected) {
    if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) {
        throwPy(PyExc_TypeError, std::string(fn) + ": " + name + " must be an int (" + expected +
                                     "), got " + typeName(v));
    }
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0 || x < min) {
        throwPy(PyExc_ValueError, std::string(fn) + ": " + name + "=" +
                                      py::str(v).cast<std::string>() + "; expected " + expected);
    }
    return x;
}

uint64_t address(const py::handle& v, const char* fn, const char* name) {
    return static_cast<uint64_t>(intArg(v, fn, name, 1, "a non-null address"));
}

uint64_t length(const py::handle& v, const char* fn) {
    return static_cast<uint64_t>(intArg(v, fn, "length", 1, "a positive byte count"));
}

Deadline deadlineOf(const py::handle& v, const char* fn) {
    if (!PyFloat_Check(v.ptr()) && !(PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()))) {
        throwPy(PyExc_TypeError,
                std::string(fn) + ": timeout_s must be a number of seconds, got " + typeName(v));
    }
    const double s = v.cast<double>();
    if (!std::isfinite(s) || s <= 0 || s > 1e7) {
        throwPy(PyExc_ValueError, std::string(fn) +
                                      ": timeout_s=" + py::str(v).cast<std::string>() +
                                      "; expected a positive, finite number of seconds");
    }
    return Deadline::after(std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9)));
}

std::string hex(uint64_t v) {
    std::ostringstream os;
    os << "0x" << std::hex << v;
    return os.str();
}

// The Python object: the shared engine plus batches whose wait timed out
// (they cannot be freed while requests are pending; retried on later calls).
class PyTransferEngine {
public:
    explicit PyTransferEngine(std::shared_ptr<SharedEngine> shared) : shared_(std::move(shared)) {}

    const std::shared_ptr<SharedEngine>& shared() const { return shared_; }

    te::TransferEngine& open(const char* fn) {
        if (shared_->closed()) {
            throwPy(PyExc_RuntimeError, std::string(fn) + ": TransferEngine '" +
                                            shared_->segmentName() + "' is closed");
        }
        return shared_->engine();
    }

    // Submits `reqs` as one batch and waits for all of them.
    Status run(te::TransferEngine& e, const std::vector<te::TransferRequest>& reqs,
               Deadline deadline) {
        reapStale(e);
        MC_ASSIGN_OR_RETURN(te::BatchID batch, e.allocateBatchID(reqs.size()));
        Status st = e.submitTransfer(batch, reqs);
        if (st.ok())
            st = e.waitBatch(batch, deadline);
        if (!e.freeBatchID(batch).ok()) {
            std::lock_guard<std::mutex> lock(mu_);
            stale_.push_back(batch);
        }
        return st;
    }

private:
    void reapStale(te::TransferEngine& e) {
        std::lock_guard<std::mutex> lock(mu_);
        std::erase_if(stale_, [&](te::BatchID b) { return e.freeBatchID(b).ok(); });
    }

    std::shared_ptr<SharedEngine> shared_;
    std::mutex mu_;
    std::vector<te::BatchID> stale_;
};

using Handle = std::shared_ptr<PyTransferEngine>;

std::shared_ptr<PyTransferEngine> construct(const py::object& store, const std::string& host_ip,
                                            const py::object& device_filter,
                                            const py::object& segment_name,
                                            const std::string& key_prefix,
                                            const py::object& timeout_s) {
    constexpr const char* fn = "TransferEngine()";
    py::object store_type = py::module_::import("torch.distributed").attr("Store");
    if (!py::isinstance(store, store_type)) {
        throwPy(PyExc_TypeError, std::string(fn) +
                                     ": store must be a torch.distributed.Store (e.g. TCPStore) "
                                     "shared by the processes that will connect, got " +
                                     typeName(store));
    }
    SharedEngineOptions options;
    options.host_ip = host_ip.empty() ? envString("MC_HOST_IP", "") : host_ip;
    if (!device_filter.is_none()) {
        if (py::isinstance<py::str>(device_filter)) {
            throwPy(PyExc_TypeError, std::string(fn) +
                                         ": device_filter must be a list of device names, got "
                                         "str '" +
                                         device_filter.cast<std::string>() + "'");
        }
        for (const auto& d : device_filter)
            options.device_filter.push_back(py::str(d).cast<std::string>());
    }
    if (!segment_name.is_none()) {
        if (!py::isinstance<py::str>(segment_name)) {
            throwPy(PyExc_TypeError, std::string(fn) +
                                         ": segment_name must be a str or None, got " +
                                         typeName(segment_name));
        }
        options.segment_name = segment_name.cast<std::string>();
        if (options.segment_name.empty() || options.segment_name.find('#') != std::string::npos) {
            throwPy(PyExc_ValueError, std::string(fn) + ": segment_name='" + options.segment_name +
                                          "'; expected a non-empty name without '#'");
        }
    }
    options.key_prefix = key_prefix;
    const Deadline deadline = deadlineOf(timeout_s, fn);
    options.timeout_ms = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining()).count());
    auto kv = C10dStoreAdapter::ownConnection(store.cast<c10::intrusive_ptr<c10d::Store>>());
    Result<std::shared_ptr<SharedEngine>> made = InvalidArgument("not created");
    {
        py::gil_scoped_release no_gil;
        made = SharedEngine::create(kv, options);
    }
    if (!made.ok())
        raiseStatus(made.status(), fn);
    return std::make_shared<PyTransferEngine>(std::move(made).value());
}

// One request from Python arguments; `fn` names the calling method.
te::TransferRequest request(te::TransferOpcode op, const py::handle& segment_id,
                            const py::handle& local_ptr, const py::handle& remote_ptr,
                            const py::handle& len, const char* fn) {
    te::TransferRequest r;
    r.opcode = op;
    r.target_id = intArg(segment_id, fn, "segment_id", 0, "an id from open_segment()");
    r.source = reinterpret_cast<void*>(address(local_ptr, fn, "local_ptr"));
    r.target_offset = address(remote_ptr, fn, "remote_ptr");
    r.length = length(len, fn);
    return r;
}

std::string describe(const te::TransferRequest& r) {
    return std::string(r.opcode == te::TransferOpcode::kWrite ? "write" : "read") +
           "(segment_id=" + std::to_string(r.target_id) +
           ", local_ptr=" + hex(reinterpret_cast<uint64_t>(r.source)) +
           ", remote_ptr=" + hex(r.target_offset) + ", length=" + std::to_string(r.length) + ")";
}

void transfer(PyTransferEngine& self, const std::vector<te::TransferRequest>& reqs,
              const py::handle& timeout_s, const char* fn, const std::string& what) {
    const Deadline deadline = deadlineOf(timeout_s, fn);
    te::TransferEngine& e = self.open(fn);
    Status st;
    {
        py::gil_scoped_release no_gil;
        st = self.run(e, reqs, deadline);
    }
    if (!st.ok())
        raiseStatus(st, std::string(fn) + " " + what);
}

// write() and read(): one request, waited for.
template <te::TransferOpcode kOp>
void single(PyTransferEngine& self, const py::object& segment_id, const py::object& local_ptr,
            const py::object& remote_ptr, const py::object& len, const py::object& timeout_s) {
    const char* fn =
        kOp == te::TransferOpcode::kWrite ? "TransferEngine.write" : "TransferEngine.read";
    te::TransferRequest r = request(kOp, segment_id, local_ptr, remote_ptr, len, fn);
    transfer(self, {r}, timeout_s, fn, describe(r));
}

// unregister_memory() and free_shared(): an address in, nothing out.
template <Status (te::TransferEngine::*kCall)(void*)>
auto byAddress(const char* fn) {
    return [fn](PyTransferEngine& self, const py::object& ptr) {
        const uint64_t a = address(ptr, fn, "ptr");
        Status st = (self.open(fn).*kCall)(reinterpret_cast<void*>(a));
        if (!st.ok())
            raiseStatus(st, std::string(fn) + "(ptr=" + hex(a) + ")");
    };
}

void closeEngine(PyTransferEngine& self) {
    Status st;
    {
        py::gil_scoped_release no_gil;
        st = self.shared()->close();
    }
    if (!st.ok()) {
        throwPy(PyExc_RuntimeError, "TransferEngine.close: engine '" +
                                        self.shared()->segmentName() + "': " + st.message());
    }
}

const char* kClassDoc = R"(A transfer engine for moving bytes between processes.

TransferEngine(store, host_ip="", device_filter=None, segment_name=None,
               key_prefix="mooncake_te", timeout_s=30.0)

store (torch.distributed.Store): shared by every process that will talk to
    this one (e.g. a TCPStore). Segment metadata is published there, and the
    engine secret is agreed through it: the first engine of the store creates
    it, the others read it, so only processes that can read the store connect.
host_ip (str): address the listeners bind to ("" = $MC_HOST_IP or 127.0.0.1).
device_filter (list[str] | None): NIC/HCA names an RDMA transport may use.
segment_name (str | None): this engine's name in the store, unique among its
    engines (None = generated); peers pass it to open_segment().
key_prefix (str): scopes the keys in the store; engines only see engines
    with the same prefix.
timeout_s (float): how long to wait for the first engine's secret.

Memory passed to write()/read() as local_ptr must be registered
(register_memory) or come from allocate_shared(); remote_ptr must lie in
memory the peer registered. Same-host peers reach allocate_shared() memory
through shared memory, everything else through tcp.

pg.set_transfer_engine(engine) makes process groups created afterwards use
this engine. The engine cannot be closed while a group uses it.)";

}  // namespace

void defineEngineBindings(py::module_& m) {
    py::class_<PyTransferEngine, Handle>(m, "TransferEngine", kClassDoc)
        .def(py::init(&construct), py::arg("store"), py::arg("host_ip") = "",
             py::arg("device_filter") = py::none(), py::arg("segment_name") = py::none(),
             py::arg("key_prefix") = "mooncake_te", py::arg("timeout_s") = kDefaultTimeoutS)
        .def_property_readonly(
            "segment_name",
            [](const PyTransferEngine& self) { return self.shared()->segmentName(); },
            "str: this engine's segment name; peers pass it to open_segment().")
        .def_property_readonly(
            "closed", [](const PyTransferEngine& self) { return self.shared()->closed(); },
            "bool: whether close() was called.")
        .def_property_readonly(
            "num_groups", [](const PyTransferEngine& self) { return self.shared()->leases(); },
            "int: process groups currently using this engine.")
        .def_property_readonly(
            "rdma_status",
            [](PyTransferEngine& self) {
                Status st = self.open("TransferEngine.rdma_status").rdmaStatus();
                return st.ok() ? std::string("rdma") : st.message();
            },
            "str: 'rdma' when peers on other hosts are reached over RDMA, otherwise why "
            "they use tcp (\"no RDMA device ...\").")
        .def(
            "preferred_hca",
            [](PyTransferEngine& self, const std::string& location) {
                auto hcas = self.open("TransferEngine.preferred_hca").preferredHca(location);
                if (!hcas.ok())
                    throwPy(PyExc_ValueError,
                            "TransferEngine.preferred_hca: " + hcas.status().message());
                return hcas.value();
            },
            py::arg("location") = "cpu",
            "list[str]: the HCAs nearest location ('cuda:<n>', 'cpu:<node>', 'cpu').")
        .def(
            "register_memory",
            [](PyTransferEngine& self, const py::object& ptr, const py::object& len) {
                constexpr const char* fn = "TransferEngine.register_memory";
                const uint64_t a = address(ptr, fn, "ptr");
                const uint64_t n = length(len, fn);
                Status st = self.open(fn).registerLocalMemory(reinterpret_cast<void*>(a), n);
                if (!st.ok())
                    raiseStatus(st, std::string(fn) + "(ptr=" + hex(a) +
                                        ", length=" + std::to_string(n) + ")");
            },
            py::arg("ptr"), py::arg("length"),
            "register_memory(ptr: int, length: int) -> None\n\n"
            "Registers [ptr, ptr+length) of this process (e.g. tensor.data_ptr()) for transfers "
            "and for peers to target. The memory must stay allocated until unregister_memory.")
        .def("unregister_memory",
             byAddress<&te::TransferEngine::unregisterLocalMemory>(
                 "TransferEngine.unregister_memory"),
             py::arg("ptr"),
             "unregister_memory(ptr: int) -> None\n\nUndoes register_memory(ptr, ...).")
        .def(
            "allocate_shared",
            [](PyTransferEngine& self, const py::object& len) {
                constexpr const char* fn = "TransferEngine.allocate_shared";
                const uint64_t n = length(len, fn);
                auto p = self.open(fn).allocateSharedMemory(n, "python");
                if (!p.ok())
                    raiseStatus(p.status(), std::string(fn) + "(length=" + std::to_string(n) + ")");
                return reinterpret_cast<uint64_t>(p.value());
            },
            py::arg("length"),
            "allocate_shared(length: int) -> int\n\n"
            "Allocates registered memory that same-host peers can map; returns its address. "
            "Free it with free_shared.")
        .def("free_shared",
             byAddress<&te::TransferEngine::freeSharedMemory>("TransferEngine.free_shared"),
             py::arg("ptr"),
             "free_shared(ptr: int) -> None\n\nFrees memory from allocate_shared().")
        .def(
            "open_segment",
            [](PyTransferEngine& self, const py::object& name, const py::object& timeout_s) {
                constexpr const char* fn = "TransferEngine.open_segment";
                if (!py::isinstance<py::str>(name)) {
                    throwPy(PyExc_TypeError,
                            std::string(fn) + ": name must be a str, got " + typeName(name));
                }
                const std::string n = name.cast<std::string>();
                const Deadline deadline = deadlineOf(timeout_s, fn);
                te::TransferEngine& e = self.open(fn);
                Result<te::SegmentID> id = InvalidArgument("not opened");
                {
                    py::gil_scoped_release no_gil;
                    id = e.openSegment(n, deadline);
                }
                if (!id.ok())
                    raiseStatus(id.status(), std::string(fn) + "(name='" + n + "')");
                return id.value();
            },
            py::arg("name"), py::arg("timeout_s") = kDefaultTimeoutS,
            "open_segment(name: str, timeout_s: float = 30.0) -> int\n\n"
            "Waits until the engine named `name` is published in the store and returns a "
            "segment id for write()/read(). TimeoutError when it does not appear in time.")
        .def("write", single<te::TransferOpcode::kWrite>, py::arg("segment_id"),
             py::arg("local_ptr"), py::arg("remote_ptr"), py::arg("length"),
             py::arg("timeout_s") = kDefaultTimeoutS,
             "write(segment_id: int, local_ptr: int, remote_ptr: int, length: int, "
             "timeout_s: float = 30.0) -> None\n\n"
             "Copies `length` bytes from local_ptr (registered here) to remote_ptr in the peer's "
             "registered memory and returns once they landed. A bad request transfers nothing.")
        .def("read", single<te::TransferOpcode::kRead>, py::arg("segment_id"), py::arg("local_ptr"),
             py::arg("remote_ptr"), py::arg("length"), py::arg("timeout_s") = kDefaultTimeoutS,
             "read(segment_id: int, local_ptr: int, remote_ptr: int, length: int, "
             "timeout_s: float = 30.0) -> None\n\n"
             "Copies `length` bytes from remote_ptr in the peer's registered memory to local_ptr "
             "(registered here) and returns once they arrived.")
        .def(
            "transfer",
            [](PyTransferEngine& self, const py::list& requests, const py::object& timeout_s) {
                constexpr const char* fn = "TransferEngine.transfer";
                std::vector<te::TransferRequest> reqs;
                for (size_t i = 0; i < requests.size(); ++i) {
                    const std::string where =
                        std::string(fn) + ": requests[" + std::to_string(i) + "]";
                    py::handle item = requests[i];
                    if (!py::isinstance<py::tuple>(item) || py::len(item) != 5) {
                        throwPy(PyExc_TypeError,
                                where +
                                    " must be a tuple (op, segment_id, local_ptr, remote_ptr, "
                                    "length), got " +
                                    py::repr(item).cast<std::string>());
                    }
                    auto t = item.cast<py::tuple>();
                    const std::string op =
                        py::isinstance<py::str>(t[0]) ? t[0].cast<std::string>() : "";
                    if (op != "write" && op != "read") {
                        throwPy(PyExc_ValueError, where +
                                                      ": op=" + py::repr(t[0]).cast<std::string>() +
                                                      "; expected 'write' or 'read'");
                    }
                    reqs.push_back(request(
                        op == "write" ? te::TransferOpcode::kWrite : te::TransferOpcode::kRead,
                        t[1], t[2], t[3], t[4], where.c_str()));
                }
                if (reqs.empty())
                    throwPy(PyExc_ValueError, std::string(fn) + ": requests is empty");
                transfer(self, reqs, timeout_s, fn,
                         "of " + std::to_string(reqs.size()) + " requests");
            },
            py::arg("requests"), py::arg("timeout_s") = kDefaultTimeoutS,
            "transfer(requests: list[tuple[str, int, int, int, int]], timeout_s: float = 30.0) "
            "-> None\n\n"
            "Runs (op, segment_id, local_ptr, remote_ptr, length) requests, op 'write' or "
            "'read', as one batch and returns when all completed. Every request is validated "
            "before any is queued.")
        .def("close", &closeEngine,
             "close() -> None\n\n"
             "Shuts the engine down; idempotent. Refused (RuntimeError) while a process group "
             "uses it: destroy the groups first.")
        .def("__enter__", [](const Handle& self) { return self; })
        .def("__exit__", [](PyTransferEngine& self, const py::args&) { closeEngine(self); })
        .def("__repr__", [](const PyTransferEngine& self) {
            return "<mooncake.engine.TransferEngine segment_name='" + self.shared()->segmentName() +
                   "'" + (self.shared()->closed() ? " closed" : "") + ">";
        });

    m.def(
        "set_transfer_engine",
        [](const py::object& engine) {
            if (engine.is_none()) {
                setTransferEngine(nullptr);
                return;
            }
            if (!py::isinstance<PyTransferEngine>(engine)) {
                throwPy(PyExc_TypeError,
                        "mooncake.pg.set_transfer_engine: engine must be a "
                        "mooncake.engine.TransferEngine or None, got " +
                            typeName(engine));
            }
            auto handle = engine.cast<Handle>();
            if (handle->shared()->closed()) {
                throwPy(PyExc_ValueError, "mooncake.pg.set_transfer_engine: TransferEngine '" +
                                              handle->shared()->segmentName() +
                                              "' is closed; expected an open engine");
            }
            setTransferEngine(handle->shared());
        },
        py::arg("engine"));
}

}  // namespace mooncake::pg
