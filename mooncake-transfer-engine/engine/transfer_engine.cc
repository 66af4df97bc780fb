#include "mooncake-transfer-engine/engine/transfer_engine.h"

#include <unistd.h>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/engine/transfer_batch.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_ipc_transport.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "mooncake-transfer-engine/transport/rdma/gpu_pci.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "mooncake-transfer-engine/transport/rdma/topology.h"
#include "mooncake-transfer-engine/transport/shm/shm_transport.h"
#include "mooncake-transfer-engine/transport/tcp/tcp_transport.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

MC_ENV_BOOL(ForceTcp, "MC_FORCE_TCP", false)
MC_ENV_BOOL(RdmaSameHost, "MC_RDMA_SAME_HOST", false)

namespace {

// Once per process and outcome: every group creates an engine, and the
// answer is the same for all of them.
void logRdmaChoice(const Status& status, const std::vector<std::string>& devices) {
    static std::mutex mu;
    static bool logged_on = false, logged_off = false;
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok() && !logged_on) {
        logged_on = true;
        MC_LOG(kInfo, "rdma") << "peers on other hosts use rdma (" << devices.front()
                              << "); same-host peers shm/cuda_ipc";
    } else if (!status.ok() && !logged_off) {
        logged_off = true;
        MC_LOG(kInfo, "rdma") << "peers on other hosts use tcp: " << status.message();
    }
}

}  // namespace

// ---- Host: the engine as its transports see it -------------------------------

class TransferEngine::Host : public TransportHost {
public:
    explicit Host(TransferEngine* engine) : engine_(engine) {}
    MemoryRegistry& memory() override { return engine_->memory_; }
    const std::string& secret() const override { return engine_->options_.secret; }
    const std::string& hostIp() const override { return engine_->host_ip_; }
    const std::string& segmentName() const override { return engine_->options_.segment_name; }
    KVStore* store() override { return engine_->options_.store.get(); }
    const std::string& keyPrefix() const override { return engine_->options_.key_prefix; }

private:
    TransferEngine* engine_;
};

// ---- lifecycle ----------------------------------------------------------------

TransferEngine::TransferEngine(EngineOptions options) : options_(std::move(options)) {
    if (envForceTcp())
        options_.force_tcp = true;
    host_ = std::make_unique<Host>(this);
}

TransferEngine::~TransferEngine() {
    shutdown();
}

Status TransferEngine::init(const std::string& host_ip,
                            const std::vector<std::string>& device_filter) {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_)
        return InvalidArgument("TransferEngine::init called twice");
    if (!options_.store)
        return InvalidArgument("EngineOptions.store is required");
    if (options_.segment_name.empty())
        return InvalidArgument("EngineOptions.segment_name is empty");
    if (options_.secret.empty())
        return InvalidArgument("EngineOptions.secret is empty");
    host_ip_ = host_ip.empty() ? "127.0.0.1" : host_ip;
    device_filter_ = device_filter;

    local_.name = options_.segment_name;
    local_.host_id = localHostId();
    local_.pid = static_cast<int32_t>(::getpid());
    if (!options_.force_tcp) {
        transports_.push_back(createShmTransport());
        // Rides on the shm transport's descriptor server; absent without CUDA.
        if (auto cuda_ipc = createCudaIpcTransport())
            transports_.push_back(std::move(cuda_ipc));
        RdmaSetup rdma =
            createRdmaTransport(RdmaOptions{device_filter, options_.verbs_library, {}});
        // A malformed filter is the caller's mistake; a missing device is not.
        if (rdma.status.code() == StatusCode::kInvalidArgument) {
            transports_.clear();  // none started yet; init may be retried
            return rdma.status.withContext("TransferEngine::init device_filter");
        }
        rdma_status_ = rdma.status;
        rdma_devices_ = rdma.devices;
        // MC_RDMA_SAME_HOST=1 (the self-test) puts rdma ahead of shm.
        if (rdma.transport && envRdmaSameHost())
            transports_.insert(transports_.begin(), std::move(rdma.transport));
        else if (rdma.transport)
            transports_.push_back(std::move(rdma.transport));
    } else {
        rdma_status_ = Unavailable("rdma off: tcp forced (MC_FORCE_TCP=1)");
    }
    logRdmaChoice(rdma_status_, rdma_devices_);
    transports_.push_back(createTcpTransport());
    for (size_t i = 0; i < transports_.size();) {
        Transport* t = transports_[i].get();
        Status st = t->start(host_.get(), &local_);
        if (st.ok()) {
            ++i;
            continue;
        }
        if (t->name() == std::string("rdma")) {
            // An HCA that is present but cannot be used (out of CQs or
            // memory, a driver fault) costs speed, not the engine: shm and
            // tcp carry everything, as when there is no HCA at all.
            t->shutdown();
            transports_.erase(transports_.begin() + static_cast<std::ptrdiff_t>(i));
            rdma_status_ = Unavailable("the rdma transport failed to start: " + st.toString());
            rdma_devices_.clear();
            local_.rdma_endpoint.clear();  // peers must not try to reach it
            MC_LOG(kWarn, "te") << rdma_status_.message() << "; using shm and tcp";
            continue;
        }
        // The name before the transports go: `t` is one of them.
        const std::string failed = std::string("starting transport ") + t->name();
        for (auto& s : transports_)
            s->shutdown();
        transports_.clear();
        return st.withContext(failed);
    }
    started_ = true;
    MC_LOG(kInfo, "te") << "segment " << local_.name << " up on " << host_ip_ << ":"
                        << local_.tcp_port << (options_.force_tcp ? " (tcp forced)" : "");
    return publishLocked();
}

void TransferEngine::shutdown() {
    std::vector<std::shared_ptr<Batch>> batches;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_)
            return;
        stopped_ = true;
        if (started_ && options_.store)
            (void)options_.store->remove(segmentKey(local_.name));
        for (auto& [id, b] : batches_)
            batches.push_back(b);
    }
    for (auto& t : transports_)
        t->shutdown();
    for (auto& b : batches) {
        for (auto& task : b->snapshot())
            task->complete(Aborted("transfer engine shut down"));
    }
}

std::string TransferEngine::segmentKey(const std::string& name) const {
    return options_.key_prefix + "/segment/" + name;
}

Status TransferEngine::publishLocked() {
    local_.generation++;
    return options_.store->set(segmentKey(local_.name), local_.serialize())
        .withContext("publishing segment " + local_.name);
}

// ---- memory -------------------------------------------------------------------

Status TransferEngine::registerLocalMemory(void* addr, size_t length, const std::string& location,
                                           bool remote_accessible) {
    if (!addr)
        return InvalidArgument("registerLocalMemory: addr is null");
    if (length == 0)
        return InvalidArgument("registerLocalMemory: length is 0");
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopped_)
        return InvalidArgument("registerLocalMemory before init/after shutdown");
    LocalRegion region{reinterpret_cast<uint64_t>(addr), length, location, remote_accessible};
    MC_RETURN_IF_ERROR(memory_.add(region));
    RegionDesc desc{region.addr, region.length, location, remote_accessible, "", "", ""};
    for (auto& t : transports_) {
        Status st = t->exportRegion(region, &desc);
        if (!st.ok()) {
            // Nothing reached it yet: no peer knows the region.
            (void)memory_.remove(region.addr, Deadline::afterMs(0));
            return st.withContext(std::string("exporting region via ") + t->name());
        }
    }
    local_.regions.push_back(desc);
    return publishLocked();
}

Status TransferEngine::unregisterLocalMemory(void* addr) {
    return unregisterLocalMemory(addr, Deadline::afterMs(kUnregisterTimeoutMs));
}

Status TransferEngine::unregisterLocalMemory(void* addr, Deadline deadline) {
    uint64_t a = reinterpret_cast<uint64_t>(addr);
    LocalRegion region;
    Status published;
    {
        std::lock_guard<std::mutex> lock(mu_);
        MC_ASSIGN_OR_RETURN(region, memory_.beginRemove(a));
        std::erase_if(local_.regions, [&](const RegionDesc& r) { return r.addr == a; });
        // A peer reading a stale descriptor is refused by the registry, so
        // a failed publish does not stop the removal.
        published = publishLocked();
    }
    // Writes that passed their bounds check before beginRemove still copy
    // into the region; they are failed rather than waited for, so a stalled
    // peer cannot hold the caller up. Not under mu_: the wait is bounded by
    // the transports' loops, not by this engine's other callers.
    for (auto& t : transports_)
        t->abortRemoteAccess(region);
    MC_RETURN_IF_ERROR(memory_.finishRemove(a, deadline)
                           .withContext("unregistering local memory at " + std::to_string(a)));
    // Only now, with nothing landing any more: a transport's own handle on
    // the region (an RDMA memory registration) goes last.
    for (auto& t : transports_)
        t->unexportRegion(a);
    return published;
}

Result<void*> TransferEngine::allocateSharedMemory(size_t length, const std::string& debug_name) {
    MC_ASSIGN_OR_RETURN(SharedAllocation alloc, memory_.allocateShared(length, debug_name));
    void* p = reinterpret_cast<void*>(alloc.addr);
    Status st = registerLocalMemory(p, alloc.length, "cpu", true);
    if (!st.ok()) {
        (void)memory_.freeShared(alloc.addr);
        return st;
    }
    return p;
}

Result<void*> TransferEngine::allocateDeviceMemory(size_t length, int device) {
    MC_ASSIGN_OR_RETURN(auto memory, allocateExportableDeviceMemory(device, length));
    MC_ASSIGN_OR_RETURN(int fd, memory->exportFd());
    const uint64_t addr = memory->addr();
    const uint64_t rounded = memory->length();
    std::string location = "cuda:" + std::to_string(device);
    // The registry owns the allocation from here: freeShared releases it.
    std::shared_ptr<ExportableDeviceMemory> owned(std::move(memory));
    MC_RETURN_IF_ERROR(
        memory_.adoptShared(addr, rounded, fd, location, [owned]() mutable { owned.reset(); })
            .status());
    void* p = reinterpret_cast<void*>(addr);
    Status st = registerLocalMemory(p, rounded, location, true);
    if (!st.ok()) {
        (void)memory_.freeShared(addr);
        return st;
    }
    return p;
}

Status TransferEngine::freeSharedMemory(void* addr) {
    MC_RETURN_IF_ERROR(unregisterLocalMemory(addr));
    return memory_.freeShared(reinterpret_cast<uint64_t>(addr));
}

// ---- segments -------------------------------------------------------------------

Result<std::shared_ptr<const SegmentDesc>> TransferEngine::fetch(const std::string& name,
                                                                 Deadline deadline) {
    MC_ASSIGN_OR_RETURN(std::string bytes, options_.store->get(segmentKey(name), deadline));
    auto parsed = SegmentDesc::parse(bytes);
    if (!parsed.ok())
        return parsed.status().withContext("segment '" + name + "'");
    return std::make_shared<const SegmentDesc>(std::move(parsed).value());
}

Result<SegmentID> TransferEngine::openSegment(const std::string& name) {
    return openSegment(name, Deadline::afterMs(options_.open_timeout_ms));
}

Result<SegmentID> TransferEngine::openSegment(const std::string& name, Deadline deadline) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!started_ || stopped_)
            return InvalidArgument("openSegment before init/after shutdown");
        for (const auto& [id, seg] : segments_) {
            if (seg.name == name)
                return id;
        }
    }
    auto desc = fetch(name, deadline);
    if (!desc.ok())
        return desc.status().withContext("openSegment('" + name + "')");
    std::lock_guard<std::mutex> lock(mu_);
    SegmentID id = next_segment_id_++;
    segments_[id] = OpenSegment{name, std::move(desc).value()};
    return id;
}

Status TransferEngine::closeSegment(SegmentID id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (segments_.erase(id) == 0)
        return NotFound("segment id " + std::to_string(id) + " is not open");
    return Status::OK();
}

Status TransferEngine::refreshSegment(SegmentID id, Deadline deadline) {
    std::string name;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = segments_.find(id);
        if (it == segments_.end())
            return NotFound("segment id " + std::to_string(id) + " is not open");
        name = it->second.name;
    }
    MC_ASSIGN_OR_RETURN(auto desc, fetch(name, deadline));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(id);
    if (it != segments_.end())
        it->second.desc = std::move(desc);
    return Status::OK();
}

Result<std::shared_ptr<const SegmentDesc>> TransferEngine::descFor(SegmentID id) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (id == kLocalSegment)
        return std::make_shared<const SegmentDesc>(local_);
    auto it = segments_.find(id);
    if (it == segments_.end())
        return NotFound("segment id " + std::to_string(id) + " is not open");
    return it->second.desc;
}

Result<SegmentDesc> TransferEngine::segmentDesc(SegmentID id) const {
    MC_ASSIGN_OR_RETURN(auto desc, descFor(id));
    return *desc;
}

Transport* TransferEngine::select(const SegmentDesc& peer, const RegionDesc& region) const {
    for (const auto& t : transports_) {
        if (t->canReach(peer, region))
            return t.get();
    }
    return nullptr;
}

Result<std::string> TransferEngine::transportFor(SegmentID id, uint64_t addr, uint64_t len) {
    MC_ASSIGN_OR_RETURN(auto desc, descFor(id));
    const RegionDesc* region = desc->findRegion(addr, len);
    if (!region)
        return OutOfRange("range is not inside a registered region of " + desc->name);
    Transport* t = select(*desc, *region);
    if (!t)
        return Unavailable("no transport reaches segment " + desc->name);
    return std::string(t->name());
}

Result<void*> TransferEngine::mapRemote(SegmentID id, uint64_t addr, uint64_t len) {
    MC_ASSIGN_OR_RETURN(auto desc, descFor(id));
    const RegionDesc* region = desc->findRegion(addr, len);
    if (!region) {
        MC_RETURN_IF_ERROR(refreshSegment(id, Deadline::afterMs(options_.open_timeout_ms)));
        MC_ASSIGN_OR_RETURN(desc, descFor(id));
        region = desc->findRegion(addr, len);
    }
    if (!region) {
        return OutOfRange("mapRemote: [" + std::to_string(addr) + ", +" + std::to_string(len) +
                          ") is not inside a registered region of segment " + desc->name);
    }
    for (const auto& t : transports_) {
        if (!t->canReach(*desc, *region))
            continue;
        auto p = t->mapPeerMemory(*desc, *region, addr, len);
        if (p.ok())
            return p;
    }
    return Unavailable("segment " + desc->name + " cannot be mapped from this process");
}

Result<std::vector<std::string>> TransferEngine::preferredHca(const std::string& location) const {
    const std::vector<std::string> devices = rdma_devices_;
    rdma::SysfsTopology topology(options_.sysfs_root);
    if (location == "cpu")
        return devices;
    if (location.rfind("cpu:", 0) == 0) {
        const std::string node = location.substr(4);
        char* end = nullptr;
        const long n = std::strtol(node.c_str(), &end, 10);
        if (node.empty() || *end != '\0' || n < 0)
            return InvalidArgument("location '" + location + "': expected cpu:<NUMA node>");
        return topology.hcasOnNumaNode(static_cast<int>(n), devices);
    }
    const int gpu = cudaOrdinal(location);
    if (gpu < 0) {
        return InvalidArgument("location '" + location +
                               "': expected 'cpu', 'cpu:<NUMA node>' or 'cuda:<device>'");
    }
    if (devices.empty())
        return devices;
    auto bus_id = rdma::cudaPciBusId(gpu);
    if (!bus_id.ok())
        return bus_id.status().withContext("get_preferred_hca(" + location + ")");
    return topology.nearestHcas(bus_id.value(), devices);
}

Status TransferEngine::probePeerAlive(SegmentID id, Deadline deadline) {
    MC_ASSIGN_OR_RETURN(auto desc, descFor(id));
    if (id == kLocalSegment)
        return Status::OK();
    // Any transport that answers for the peer is proof of life; tcp is last
    // in the list and reaches every peer.
    Status last = Unavailable("no transport can probe " + desc->name);
    for (const auto& t : transports_) {
        last = t->probe(*desc, deadline);
        if (last.ok())
            return last;
    }
    return last;
}

}  // namespace mooncake::te
