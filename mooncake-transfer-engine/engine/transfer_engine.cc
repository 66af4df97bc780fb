#include "mooncake-transfer-engine/engine/transfer_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"
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

// ---- TransferTask -----------------------------------------------------------

void TransferTask::complete(Status status) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (state_.load(std::memory_order_relaxed) != TransferState::kPending)
            return;
        error_ = std::move(status);
        state_.store(error_.ok() ? TransferState::kCompleted : TransferState::kFailed,
                     std::memory_order_release);
    }
    if (signal_)
        signal_->notify(this);
}

// ---- CompletionSignal ---------------------------------------------------------

// No lost wakeup. complete() stores the task's state, then (after a fence)
// reads waiters_; a waiter raises waiters_, then (after a fence) reads the
// state. With the fences at least one sees the other's write: either the
// waiter finds the task done, or notify() sees the waiter and, under mu_,
// where the waiter registered before sleeping, wakes it.
void CompletionSignal::notify(const TransferTask* task) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_relaxed) == 0)
        return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (std::find(awaited_.begin(), awaited_.end(), task) == awaited_.end())
            return;
    }
    cv_.notify_all();
}

bool CompletionSignal::wait(const TransferTask& task, Deadline deadline) {
    if (task.done())
        return true;
    std::unique_lock<std::mutex> lock(mu_);
    awaited_.push_back(&task);
    waiters_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool done = true;
    while (!task.done()) {
        if (deadline.at() == Deadline::Clock::time_point::max()) {
            cv_.wait(lock);  // wait_until(max) would overflow
        } else if (cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout) {
            done = task.done();
            break;
        }
    }
    awaited_.erase(std::find(awaited_.begin(), awaited_.end(), &task));
    waiters_.fetch_sub(1, std::memory_order_relaxed);
    return done;
}

TransferStatus TransferTask::status() const {
    TransferStatus s;
    s.state = state_.load(std::memory_order_acquire);
    if (s.state == TransferState::kFailed) {
        std::lock_guard<std::mutex> lock(mu_);
        s.error = error_;
    }
    return s;
}

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

struct TransferEngine::Batch {
    size_t capacity = 0;
    std::shared_ptr<CompletionSignal> signal = std::make_shared<CompletionSignal>();
    // Guards `tasks`: one thread may submit while another waits or queries.
    std::mutex mu;
    std::vector<std::shared_ptr<TransferTask>> tasks;
    // tasks.size(), for checks that need no lock.
    std::atomic<size_t> count{0};

    std::vector<std::shared_ptr<TransferTask>> snapshot() {
        std::lock_guard<std::mutex> lock(mu);
        return tasks;
    }
    // Task i, or nullptr past the end; *more: whether tasks follow it. Tasks
    // are only appended and stay owned by `tasks`, so the pointer stays valid
    // while the batch lives.
    TransferTask* at(size_t i, bool* more) {
        std::lock_guard<std::mutex> lock(mu);
        *more = i + 1 < tasks.size();
        return i < tasks.size() ? tasks[i].get() : nullptr;
    }
    bool allDone() {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& t : tasks) {
            if (!t->done())
                return false;
        }
        return true;
    }
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

// ---- transfers --------------------------------------------------------------------

Result<BatchID> TransferEngine::allocateBatchID(size_t capacity) {
    if (capacity == 0)
        return InvalidArgument("allocateBatchID: capacity is 0");
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopped_)
        return InvalidArgument("allocateBatchID before init/after shutdown");
    auto batch = std::make_shared<Batch>();
    batch->capacity = capacity;
    BatchID id = next_batch_id_++;
    batches_[id] = std::move(batch);
    return id;
}

Status TransferEngine::validate(const TransferRequest& req,
                                std::shared_ptr<const SegmentDesc>* peer, const RegionDesc** region,
                                std::optional<Deadline>* refresh_deadline) {
    if (req.length == 0)
        return InvalidArgument("request length is 0");
    if (req.opcode != TransferOpcode::kRead && req.opcode != TransferOpcode::kWrite) {
        return InvalidArgument("unknown opcode " + std::to_string(static_cast<int>(req.opcode)));
    }
    uint64_t src = reinterpret_cast<uint64_t>(req.source);
    if (!memory_.find(src, req.length)) {
        return InvalidArgument("source [" + std::to_string(src) + ", +" +
                               std::to_string(req.length) +
                               ") is not inside a locally registered region");
    }
    MC_ASSIGN_OR_RETURN(*peer, descFor(req.target_id));
    *region = (*peer)->findRegion(req.target_offset, req.length);
    if (!*region && req.target_id != kLocalSegment) {
        // The peer may have registered more memory since we opened it.
        if (!*refresh_deadline)
            *refresh_deadline = Deadline::afterMs(1000);
        MC_RETURN_IF_ERROR(refreshSegment(req.target_id, **refresh_deadline));
        MC_ASSIGN_OR_RETURN(*peer, descFor(req.target_id));
        *region = (*peer)->findRegion(req.target_offset, req.length);
    }
    if (!*region || !(*region)->remote_accessible) {
        return OutOfRange(
            "target [" + std::to_string(req.target_offset) + ", +" + std::to_string(req.length) +
            ") is not inside a remotely accessible region of segment " + (*peer)->name);
    }
    return Status::OK();
}

Status TransferEngine::submitTransfer(BatchID batch_id,
                                      const std::vector<TransferRequest>& requests) {
    std::shared_ptr<Batch> batch;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_)
            return Aborted("transfer engine shut down");
        auto it = batches_.find(batch_id);
        if (it == batches_.end())
            return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
        batch = it->second;
    }
    auto overCapacity = [&](size_t adding) -> Status {
        const size_t total = batch->count.load(std::memory_order_relaxed) + adding;
        if (total <= batch->capacity)
            return Status::OK();
        return InvalidArgument("batch " + std::to_string(batch_id) + " holds " +
                               std::to_string(batch->capacity) + " requests; " +
                               std::to_string(total) + " submitted");
    };
    // Checked again under the lock when the tasks are added: another thread
    // may submit to the batch meanwhile.
    MC_RETURN_IF_ERROR(overCapacity(requests.size()));
    // Validate all first so a bad request transfers nothing.
    struct Planned {
        std::shared_ptr<TransferTask> task;
        Transport* transport;  // nullptr: local copy
    };
    std::vector<Planned> planned;
    planned.reserve(requests.size());
    // Starts with the first refresh: reading the clock is not free.
    std::optional<Deadline> refresh;
    for (size_t i = 0; i < requests.size(); ++i) {
        std::shared_ptr<const SegmentDesc> peer;
        const RegionDesc* region = nullptr;
        Status st = validate(requests[i], &peer, &region, &refresh);
        if (!st.ok())
            return st.withContext("request " + std::to_string(i));
        Transport* t = nullptr;
        // validate() found the source registered; its location says who may copy it.
        const auto source =
            memory_.find(reinterpret_cast<uint64_t>(requests[i].source), requests[i].length);
        const bool device_source = source && cudaOrdinal(source->location) >= 0;
        if (requests[i].target_id != kLocalSegment) {
            t = select(*peer, *region);
            if (!t)
                return Unavailable("request " + std::to_string(i) + ": no transport reaches " +
                                   peer->name);
        }
        if (device_source && (!t || !t->copiesDeviceMemory())) {
            return Unavailable(
                "request " + std::to_string(i) + ": the source is device memory (" +
                source->location + ") and " +
                (t ? std::string("the ") + t->name() + " transport" : std::string("a local copy")) +
                " copies host memory only");
        }
        if (!t && cudaOrdinal(region->location) >= 0) {
            return Unavailable("request " + std::to_string(i) +
                               ": a local copy into device memory (" + region->location +
                               ") is not supported; copy on a CUDA stream instead");
        }
        planned.push_back(
            {std::make_shared<TransferTask>(requests[i], std::move(peer), batch->signal), t});
    }
    {
        std::lock_guard<std::mutex> lock(batch->mu);
        MC_RETURN_IF_ERROR(overCapacity(planned.size()));
        for (auto& p : planned)
            batch->tasks.push_back(p.task);
        batch->count.store(batch->tasks.size(), std::memory_order_relaxed);
    }
    for (auto& p : planned) {
        if (p.transport) {
            p.transport->submit(p.task);
            continue;
        }
        const TransferRequest& r = p.task->request();
        void* remote = reinterpret_cast<void*>(r.target_offset);
        if (r.opcode == TransferOpcode::kWrite)
            std::memmove(remote, r.source, r.length);
        else
            std::memmove(r.source, remote, r.length);
        p.task->complete(Status::OK());
    }
    return Status::OK();
}

Result<TransferStatus> TransferEngine::getTransferStatus(BatchID batch_id, size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = batches_.find(batch_id);
    if (it == batches_.end())
        return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
    std::lock_guard<std::mutex> batch_lock(it->second->mu);
    if (index >= it->second->tasks.size()) {
        return InvalidArgument("request index " + std::to_string(index) + " >= submitted count " +
                               std::to_string(it->second->tasks.size()));
    }
    return it->second->tasks[index]->status();
}

Status TransferEngine::waitBatch(BatchID batch_id, Deadline deadline) {
    std::shared_ptr<Batch> batch;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = batches_.find(batch_id);
        if (it == batches_.end())
            return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
        batch = it->second;
    }
    // In index order, so the failure reported is the first one by index.
    // Tasks submitted while this waits are waited for too.
    bool more = true;
    for (size_t i = 0; more; ++i) {
        TransferTask* task = batch->at(i, &more);
        if (!task)
            break;
        if (!batch->signal->wait(*task, deadline)) {
            return Timeout("batch " + std::to_string(batch_id) +
                           " did not complete before the deadline");
        }
        TransferStatus s = task->status();
        if (s.state == TransferState::kFailed)
            return s.error;
    }
    return Status::OK();
}

Status TransferEngine::freeBatchID(BatchID batch_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = batches_.find(batch_id);
    if (it == batches_.end())
        return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
    if (!it->second->allDone())
        return InvalidArgument("batch " + std::to_string(batch_id) + " still has pending requests");
    batches_.erase(it);
    return Status::OK();
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
