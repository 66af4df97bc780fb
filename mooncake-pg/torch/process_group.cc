#include "mooncake-pg/torch/process_group.h"

#include <mutex>
#include <sstream>
#include <utility>

#include <c10/util/Exception.h>

#include "mooncake-transfer-engine/common/env.h"

namespace mooncake::pg {

namespace {

MC_ENV_INT(TimeoutMs, "MC_PG_TIMEOUT_MS", 0)

struct HostSettings {
    std::mutex mu;
    std::string host_ip = envString("MC_HOST_IP", "127.0.0.1");
    std::vector<std::string> device_filter;
    std::shared_ptr<SharedEngine> engine;
};

HostSettings& hostSettings() {
    static HostSettings settings;
    return settings;
}

std::string describeTensor(const at::Tensor& t) {
    if (!t.defined())
        return "an undefined tensor";
    std::ostringstream os;
    os << "dtype=" << dtypeName(t.scalar_type()) << ", device=" << t.device()
       << ", size=" << t.sizes() << (t.is_contiguous() ? "" : ", non-contiguous");
    return os.str();
}

// torch hands the creator a timeout whether or not the user passed one:
// init_process_group/new_group substitute their default (30 min for every
// backend but nccl) for an omitted one. So that value stands for "not
// given", and only then does MC_PG_TIMEOUT_MS, an environment default,
// apply; an explicit timeout=, of any other value, wins.
std::chrono::milliseconds resolveTimeout(std::chrono::milliseconds given) {
    const bool defaulted = given.count() <= 0 || given == kBackendDefaultTimeout;
    if (defaulted && envTimeoutMs() > 0)
        return std::chrono::milliseconds(envTimeoutMs());
    return given.count() > 0 ? given : kBackendDefaultTimeout;
}

// Tensors may only be on devices whose c10d kernels reach the backend; the
// backend itself explains CUDA tensors. `backend` names the group's backend.
void screen(const at::Tensor& t, const char* op, const std::string& backend) {
    TORCH_CHECK(!t.defined() || t.is_cpu() || t.is_cuda(), "Mooncake PG: ", op,
                ": a tensor is on device ", t.device().str(), "; backend '", backend, "' takes CPU",
                backend == "mooncake" ? " or CUDA" : "", " tensors");
}

void screen(const std::vector<at::Tensor>& tensors, const char* op, const std::string& backend) {
    for (const auto& t : tensors)
        screen(t, op, backend);
}

void screen(const std::vector<std::vector<at::Tensor>>& lists, const char* op,
            const std::string& backend) {
    for (const auto& list : lists)
        screen(list, op, backend);
}

}  // namespace

void MooncakeBackendOptions::validate() const {
    TORCH_CHECK_VALUE(auto_deactivate_on_failure || !auto_sync_on_failure,
                      "MooncakeBackendOptions: auto_sync_on_failure=True requires "
                      "auto_deactivate_on_failure=True (automatic sync applies deactivations "
                      "that only the PG-managed mode makes); for framework-managed failure "
                      "handling pass auto_deactivate_on_failure=False, auto_sync_on_failure=False");
    TORCH_CHECK_VALUE(max_group_size >= 0,
                      "MooncakeBackendOptions: max_group_size=", max_group_size,
                      " must be at least 1");
    if (!active_ranks.has_value())
        return;
    const at::Tensor& t = *active_ranks;
    TORCH_CHECK_VALUE(t.defined() && t.scalar_type() == at::kInt && t.dim() == 1 &&
                          t.is_contiguous() && t.numel() > 0,
                      "MooncakeBackendOptions: active_ranks must be a contiguous 1-D torch.int32 "
                      "tensor with one entry per rank slot (on CPU or an accelerator); got ",
                      describeTensor(t));
    TORCH_CHECK_VALUE(max_group_size == 0 || t.numel() == max_group_size,
                      "MooncakeBackendOptions: active_ranks has ", t.numel(),
                      " entries but max_group_size=", max_group_size,
                      "; size active_ranks to max_group_size");
}

std::string MooncakeBackendOptions::toString() const {
    std::ostringstream os;
    os << "MooncakeBackendOptions(max_group_size="
       << (max_group_size > 0 ? std::to_string(max_group_size) : std::string("None"))
       << ", is_extension=" << (is_extension ? "True" : "False")
       << ", auto_deactivate_on_failure=" << (auto_deactivate_on_failure ? "True" : "False")
       << ", auto_sync_on_failure=" << (auto_sync_on_failure ? "True" : "False")
       << ", active_ranks=" << (active_ranks ? describeTensor(*active_ranks) : "None") << ")";
    return os.str();
}

MooncakeProcessGroup::MooncakeProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                           c10::intrusive_ptr<MooncakeBackend> backend)
    : c10d::ProcessGroup(store, backend->getRank(), backend->getSize()),
      backend_(std::move(backend)) {
    setDefaultBackend(BackendType::CUSTOM);
    const c10::intrusive_ptr<c10d::Backend> as_backend = backend_;
    // Both device types route here so that a tensor on the other device
    // gets this backend's explanation rather than torch's "no backend for
    // device", and so that object collectives (which prefer CPU when a group
    // has a CPU backend) work on `mooncake` groups too.
    setBackend(c10::DeviceType::CPU, BackendType::CUSTOM, as_backend);
    setBackend(c10::DeviceType::CUDA, BackendType::CUSTOM, as_backend);
}

int MooncakeProcessGroup::getSize() const {
    return backend_->groupSize();
}

const std::string MooncakeProcessGroup::getBackendName() const {
    return backend_->getBackendName();
}

template <typename... Args>
void MooncakeProcessGroup::screenAll(const char* op, const Args&... args) const {
    const std::string backend = backend_->getBackendName();
    (screen(args, op, backend), ...);
}

using PG = MooncakeProcessGroup;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

WorkPtr PG::broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
    screenAll("broadcast", tensors);
    return ProcessGroup::broadcast(tensors, opts);
}

WorkPtr PG::allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
    screenAll("all_reduce", tensors);
    return ProcessGroup::allreduce(tensors, opts);
}

WorkPtr PG::allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
    screenAll("all_reduce_coalesced", tensors);
    return ProcessGroup::allreduce_coalesced(tensors, opts);
}

WorkPtr PG::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
    screenAll("reduce", tensors);
    return ProcessGroup::reduce(tensors, opts);
}

WorkPtr PG::allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                      const c10d::AllgatherOptions& opts) {
    screenAll("all_gather", inputs, outputs);
    return ProcessGroup::allgather(outputs, inputs, opts);
}

WorkPtr PG::_allgather_base(at::Tensor& output, at::Tensor& input,
                            const c10d::AllgatherOptions& opts) {
    screenAll("all_gather_into_tensor", input, output);
    return ProcessGroup::_allgather_base(output, input, opts);
}

WorkPtr PG::allgather_coalesced(std::vector<Tensors>& output_lists, Tensors& inputs,
                                const c10d::AllgatherOptions& opts) {
    screenAll("all_gather_coalesced", inputs, output_lists);
    return ProcessGroup::allgather_coalesced(output_lists, inputs, opts);
}

WorkPtr PG::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                            const c10d::AllgatherOptions& opts) {
    screenAll("all_gather_into_tensor_coalesced", inputs, outputs);
    return ProcessGroup::allgather_into_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr PG::gather(std::vector<Tensors>& outputs, Tensors& inputs,
                   const c10d::GatherOptions& opts) {
    screenAll("gather", inputs, outputs);
    return ProcessGroup::gather(outputs, inputs, opts);
}

WorkPtr PG::scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                    const c10d::ScatterOptions& opts) {
    screenAll("scatter", outputs, inputs);
    return ProcessGroup::scatter(outputs, inputs, opts);
}

WorkPtr PG::reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                           const c10d::ReduceScatterOptions& opts) {
    screenAll("reduce_scatter", outputs, inputs);
    return ProcessGroup::reduce_scatter(outputs, inputs, opts);
}

WorkPtr PG::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                 const c10d::ReduceScatterOptions& opts) {
    screenAll("reduce_scatter_tensor", input, output);
    return ProcessGroup::_reduce_scatter_base(output, input, opts);
}

WorkPtr PG::reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                            const c10d::ReduceScatterOptions& opts) {
    screenAll("reduce_scatter_tensor_coalesced", inputs, outputs);
    return ProcessGroup::reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

WorkPtr PG::alltoall_base(at::Tensor& output, at::Tensor& input,
                          std::vector<int64_t>& output_split_sizes,
                          std::vector<int64_t>& input_split_sizes,
                          const c10d::AllToAllOptions& opts) {
    screenAll("all_to_all_single", input, output);
    return ProcessGroup::alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

WorkPtr PG::alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) {
    screenAll("all_to_all", inputs, outputs);
    return ProcessGroup::alltoall(outputs, inputs, opts);
}

WorkPtr PG::send(Tensors& tensors, int dst_rank, int tag) {
    screenAll("send", tensors);
    return ProcessGroup::send(tensors, dst_rank, tag);
}

WorkPtr PG::recv(Tensors& tensors, int src_rank, int tag) {
    screenAll("recv", tensors);
    return ProcessGroup::recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<MooncakeProcessGroup> createMooncakeProcessGroup(
    const c10d::DistributedBackendOptions& dist_options,
    c10::intrusive_ptr<MooncakeBackendOptions> options, bool is_cuda) {
    TORCH_CHECK(dist_options.store, "Mooncake PG: the backend creator got no store");
    // A private copy: one options object may be passed to several groups,
    // and the group records its own timeout and name in it.
    auto own = options ? c10::make_intrusive<MooncakeBackendOptions>(*options)
                       : c10::make_intrusive<MooncakeBackendOptions>();
    own->validate();

    BackendConfig config;
    config.rank = dist_options.group_rank;
    config.size = dist_options.group_size;
    config.is_cuda = is_cuda;
    config.group_name = dist_options.group_id;
    config.timeout =
        resolveTimeout(std::chrono::duration_cast<std::chrono::milliseconds>(dist_options.timeout));
    {
        HostSettings& s = hostSettings();
        std::lock_guard<std::mutex> lock(s.mu);
        config.host_ip = s.host_ip;
        config.device_filter = s.device_filter;
        config.shared_engine = s.engine;
    }
    own->timeout = config.timeout;
    own->group_name = dist_options.group_id;
    own->global_ranks_in_group.assign(dist_options.global_ranks_in_group.begin(),
                                      dist_options.global_ranks_in_group.end());
    config.options = own;

    auto backend = c10::make_intrusive<MooncakeBackend>(dist_options.store, std::move(config));
    return c10::make_intrusive<MooncakeProcessGroup>(dist_options.store, std::move(backend));
}

void setHostIp(const std::string& host_ip) {
    TORCH_CHECK_VALUE(!host_ip.empty(), "Mooncake PG: set_host_ip got an empty address");
    HostSettings& s = hostSettings();
    std::lock_guard<std::mutex> lock(s.mu);
    s.host_ip = host_ip;
}

void setDeviceFilter(const std::vector<std::string>& filter) {
    HostSettings& s = hostSettings();
    std::lock_guard<std::mutex> lock(s.mu);
    s.device_filter = filter;
}

void setTransferEngine(std::shared_ptr<SharedEngine> engine) {
    HostSettings& s = hostSettings();
    std::lock_guard<std::mutex> lock(s.mu);
    s.engine = std::move(engine);
}

}  // namespace mooncake::pg
