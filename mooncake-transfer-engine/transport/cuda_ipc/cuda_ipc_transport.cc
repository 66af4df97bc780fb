// The cuda_ipc transport. An exportable device allocation is published like a
// memfd: RegionDesc.cuda_ipc_export carries (allocation id, base, length) in
// the shm export encoding, and the descriptor is fetched once over the peer's
// shm socket, which checks the group secret, then imported and mapped for
// this process's device. Transfers are bounds-checked copies on one stream,
// complete when the copy is.
#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_ipc_transport.h"

#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_driver.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "mooncake-transfer-engine/transport/shm/shm_protocol.h"

namespace mooncake::te {

namespace {

// How long the first transfer to a peer allocation may spend fetching and
// importing its descriptor.
MC_ENV_INT(CudaIpcOpenTimeoutMs, "MC_CUDA_IPC_OPEN_TIMEOUT_MS", 5000)

class CudaIpcTransport final : public Transport {
public:
    explicit CudaIpcTransport(const CudaDriver& cu) : cu_(cu) {}
    ~CudaIpcTransport() override { shutdown(); }

    const char* name() const override { return "cuda_ipc"; }
    Status start(TransportHost* host, SegmentDesc* local) override;
    Status exportRegion(const LocalRegion& region, RegionDesc* desc) override;
    bool canReach(const SegmentDesc& peer, const RegionDesc& region) const override;
    bool copiesDeviceMemory() const override { return true; }
    void submit(const std::shared_ptr<TransferTask>& task) override;
    Result<void*> mapPeerMemory(const SegmentDesc& peer, const RegionDesc& region, uint64_t addr,
                                uint64_t len) override;
    // The shm transport answers for the same socket; nothing to add.
    Status probe(const SegmentDesc& peer, Deadline deadline) override {
        (void)deadline;
        return Unavailable("cuda_ipc does not probe segment " + peer.name + " itself");
    }
    void shutdown() override;

private:
    // This process's view of the peer's [addr, addr+len); the mapping stays
    // until shutdown, which is the lifetime promised for mapped pointers.
    Result<char*> resolve(const SegmentDesc& peer, const RegionDesc& region, uint64_t addr,
                          uint64_t len);
    Result<std::shared_ptr<ImportedDeviceMemory>> open(const SegmentDesc& peer,
                                                       const ShmExport& alloc);
    // The device peers' memory is mapped for and copies run on: the device of
    // this process's first exported allocation, else the calling thread's
    // current device, else 0.
    int localDevice() const;
    Status copy(void* dst, const void* src, uint64_t len);

    const CudaDriver& cu_;
    TransportHost* host_ = nullptr;
    std::atomic<int> export_device_{-1};
    std::atomic<bool> stopped_{false};

    std::mutex maps_mu_;  // guards maps_
    std::map<std::string, std::shared_ptr<ImportedDeviceMemory>> maps_;

    std::mutex copy_mu_;  // guards stream_ and serializes copies on it
    CUstream stream_ = nullptr;
    int stream_device_ = -1;
};

Status CudaIpcTransport::start(TransportHost* host, SegmentDesc* local) {
    (void)local;
    host_ = host;
    return Status::OK();
}

Status CudaIpcTransport::exportRegion(const LocalRegion& region, RegionDesc* desc) {
    if (!region.remote_accessible || cudaOrdinal(region.location) < 0)
        return Status::OK();
    auto alloc = host_->memory().findShared(region.addr, region.length);
    // Device memory we did not allocate (cudaMalloc) cannot be exported this
    // way; peers then find no transport for it and say so.
    if (!alloc || alloc->location != region.location)
        return Status::OK();
    int expected = -1;
    export_device_.compare_exchange_strong(expected, cudaOrdinal(region.location));
    desc->cuda_ipc_export = encodeShmExport(ShmExport{alloc->id, alloc->addr, alloc->length});
    return Status::OK();
}

bool CudaIpcTransport::canReach(const SegmentDesc& peer, const RegionDesc& region) const {
    return peer.host_id == localHostId() && !peer.shm_socket.empty() &&
           !region.cuda_ipc_export.empty();
}

int CudaIpcTransport::localDevice() const {
    int device = export_device_.load(std::memory_order_relaxed);
    if (device >= 0)
        return device;
    CUcontext ctx = nullptr;
    CUdevice current = 0;
    if (cu_.ctxGetCurrent(&ctx) == CUDA_SUCCESS && ctx &&
        cu_.ctxGetDevice(&current) == CUDA_SUCCESS)
        return static_cast<int>(current);
    return 0;
}

Result<std::shared_ptr<ImportedDeviceMemory>> CudaIpcTransport::open(const SegmentDesc& peer,
                                                                     const ShmExport& alloc) {
    ShmRequest request{ShmOp::kOpenAllocation, alloc.alloc_id, host_->secret()};
    uint64_t length = 0;
    auto fd =
        shmCall(peer.shm_socket, request, Deadline::afterMs(envCudaIpcOpenTimeoutMs()), &length);
    if (!fd.ok()) {
        return fd.status().withContext("fetching device allocation " +
                                       std::to_string(alloc.alloc_id) + " of segment " + peer.name);
    }
    if (length != alloc.length) {
        return PeerFailure("segment " + peer.name + " device allocation " +
                           std::to_string(alloc.alloc_id) + " is " + std::to_string(length) +
                           " bytes; its descriptor says " + std::to_string(alloc.length));
    }
    auto imported = importDeviceMemory(fd->get(), length, localDevice());
    if (!imported.ok()) {
        return imported.status().withContext("mapping device allocation " +
                                             std::to_string(alloc.alloc_id) + " of segment " +
                                             peer.name);
    }
    MC_LOG(kDebug, "cuda_ipc") << "mapped " << length << " bytes of segment " << peer.name
                               << " device allocation " << alloc.alloc_id;
    return std::shared_ptr<ImportedDeviceMemory>(std::move(imported).value());
}

Result<char*> CudaIpcTransport::resolve(const SegmentDesc& peer, const RegionDesc& region,
                                        uint64_t addr, uint64_t len) {
    if (stopped_.load(std::memory_order_acquire))
        return Aborted("cuda_ipc transport shut down");
    if (!canReach(peer, region))
        return Unavailable("segment " + peer.name + " is not reachable through cuda_ipc");
    if (!region.remote_accessible || !region.contains(addr, len)) {
        return OutOfRange("[" + std::to_string(addr) + ", +" + std::to_string(len) +
                          ") is not inside a remotely accessible region of segment " + peer.name);
    }
    auto alloc = decodeShmExport(region.cuda_ipc_export);
    if (!alloc.ok())
        return alloc.status().withContext("segment " + peer.name);
    if (!alloc->covers(region.addr, region.length))
        return InvalidArgument("segment " + peer.name + " exports a region outside its allocation");
    // The shm socket name is random per engine start, so the key also tells a
    // restarted peer (same name, maybe same pid) from its predecessor.
    std::string key = peer.name + "|" + std::to_string(peer.pid) + "|" + peer.shm_socket + "|" +
                      std::to_string(alloc->alloc_id);
    std::shared_ptr<ImportedDeviceMemory> mapped;
    {
        // Held across the import: two threads mapping the same allocation
        // would otherwise both pay for it and one mapping would be wasted.
        std::lock_guard<std::mutex> lock(maps_mu_);
        auto it = maps_.find(key);
        if (it != maps_.end()) {
            mapped = it->second;
        } else {
            MC_ASSIGN_OR_RETURN(mapped, open(peer, alloc.value()));
            maps_.emplace(key, mapped);
        }
    }
    if (mapped->length() != alloc->length) {
        return PeerFailure("segment " + peer.name + " changed the bounds of device allocation " +
                           std::to_string(alloc->alloc_id));
    }
    return mapped->ptr() + (addr - alloc->base);
}

Status CudaIpcTransport::copy(void* dst, const void* src, uint64_t len) {
    std::lock_guard<std::mutex> lock(copy_mu_);
    int device = localDevice();
    MC_RETURN_IF_ERROR(useDevice(cu_, device));
    if (!stream_ || stream_device_ != device) {
        if (stream_)
            (void)cu_.streamDestroy(stream_);
        stream_ = nullptr;
        MC_RETURN_IF_ERROR(
            cu_.check(cu_.streamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
        stream_device_ = device;
    }
    MC_RETURN_IF_ERROR(cu_.check(cu_.memcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                 reinterpret_cast<CUdeviceptr>(src), len, stream_),
                                 "cuMemcpyAsync(" + std::to_string(len) + " bytes)"));
    return cu_.check(cu_.streamSynchronize(stream_), "cuStreamSynchronize");
}

void CudaIpcTransport::submit(const std::shared_ptr<TransferTask>& task) {
    const TransferRequest& req = task->request();
    const SegmentDesc& peer = task->peer();
    // Re-derive the region instead of trusting the caller: this is the last
    // check before bytes are stored into another process.
    const RegionDesc* region = peer.findRegion(req.target_offset, req.length);
    if (!region) {
        task->complete(OutOfRange("cuda_ipc: target [" + std::to_string(req.target_offset) + ", +" +
                                  std::to_string(req.length) + ") is not inside a region of " +
                                  peer.name));
        return;
    }
    auto target = resolve(peer, *region, req.target_offset, req.length);
    if (!target.ok()) {
        task->complete(target.status().withContext("cuda_ipc transfer"));
        return;
    }
    Status st = req.opcode == TransferOpcode::kWrite ? copy(target.value(), req.source, req.length)
                                                     : copy(req.source, target.value(), req.length);
    task->complete(st.ok() ? st : st.withContext("cuda_ipc transfer to segment " + peer.name));
}

Result<void*> CudaIpcTransport::mapPeerMemory(const SegmentDesc& peer, const RegionDesc& region,
                                              uint64_t addr, uint64_t len) {
    MC_ASSIGN_OR_RETURN(char* ptr, resolve(peer, region, addr, len));
    return static_cast<void*>(ptr);
}

void CudaIpcTransport::shutdown() {
    if (stopped_.exchange(true, std::memory_order_acq_rel))
        return;
    {
        std::lock_guard<std::mutex> lock(copy_mu_);
        if (stream_)
            (void)cu_.streamDestroy(stream_);
        stream_ = nullptr;
    }
    std::lock_guard<std::mutex> lock(maps_mu_);
    maps_.clear();
}

}  // namespace

std::unique_ptr<Transport> createCudaIpcTransport() {
    auto cu = CudaDriver::get();
    if (!cu.ok()) {
        static std::once_flag logged;
        std::call_once(logged, [&] {
            MC_LOG(kInfo, "cuda_ipc") << "cuda_ipc transport off: " << cu.status().toString();
        });
        return nullptr;
    }
    return std::make_unique<CudaIpcTransport>(*cu.value());
}

}  // namespace mooncake::te
