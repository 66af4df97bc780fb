// Shared-memory transport. Same-host peers exchange the memfds behind their
// engine shared allocations (MemoryRegistry::allocateShared) over an abstract
// unix socket guarded by the group secret, map them once, and from then on a
// transfer is a bounds-checked memcpy on the submitting thread.
//
// Owner side:  ShmServer hands out memfds (shm_server.h).
// Peer side:   PeerMappings caches the mapped allocations (peer_mappings.h).
// Wire format: shm_protocol.h.
#include "mooncake-transfer-engine/transport/shm/shm_transport.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/random.h"
#include "mooncake-transfer-engine/transport/shm/peer_mappings.h"
#include "mooncake-transfer-engine/transport/shm/shm_protocol.h"
#include "mooncake-transfer-engine/transport/shm/shm_server.h"

namespace mooncake::te {

namespace {

// How long the first transfer to a peer allocation may spend fetching its
// memfd. Later transfers reuse the mapping and never touch the socket.
MC_ENV_INT(ShmOpenTimeoutMs, "MC_SHM_OPEN_TIMEOUT_MS", 5000)

class ShmTransport final : public Transport {
public:
    ~ShmTransport() override { shutdown(); }

    const char* name() const override { return "shm"; }
    Status start(TransportHost* host, SegmentDesc* local) override;
    Status exportRegion(const LocalRegion& region, RegionDesc* desc) override;
    bool canReach(const SegmentDesc& peer, const RegionDesc& region) const override;
    void submit(const std::shared_ptr<TransferTask>& task) override;
    Result<void*> mapPeerMemory(const SegmentDesc& peer, const RegionDesc& region, uint64_t addr,
                                uint64_t len) override;
    Status probe(const SegmentDesc& peer, Deadline deadline) override;
    void shutdown() override;

private:
    struct Target {
        std::shared_ptr<PeerMapping> mapping;  // keeps `ptr` mapped while in use
        char* ptr = nullptr;
    };

    // This process's view of the peer's [addr, addr+len), which must lie in
    // `region`; the region in turn must lie in the allocation it exports.
    Result<Target> resolve(const SegmentDesc& peer, const RegionDesc& region, uint64_t addr,
                           uint64_t len, Deadline deadline);
    Result<std::shared_ptr<PeerMapping>> open(const SegmentDesc& peer, const ShmExport& alloc,
                                              Deadline deadline);

    TransportHost* host_ = nullptr;
    std::unique_ptr<ShmServer> server_;
    PeerMappings mappings_;
    std::atomic<bool> stopped_{false};
    std::mutex shutdown_mu_;
};

Status ShmTransport::start(TransportHost* host, SegmentDesc* local) {
    host_ = host;
    // A random name keeps unrelated processes from guessing the socket, and a
    // restarted peer never collides with its predecessor's name.
    std::string name = "mooncake-shm-" + randomHex(16);
    MC_ASSIGN_OR_RETURN(server_, ShmServer::start(host, name));
    local->shm_socket = name;
    MC_LOG(kInfo, "shm") << "segment " << host->segmentName() << " serves shm on @" << name;
    return Status::OK();
}

Status ShmTransport::exportRegion(const LocalRegion& region, RegionDesc* desc) {
    if (!region.remote_accessible)
        return Status::OK();
    auto alloc = host_->memory().findShared(region.addr, region.length);
    if (!alloc || alloc->location != "cpu")
        return Status::OK();  // plain or device memory: peers use another transport
    desc->shm_export = encodeShmExport(ShmExport{alloc->id, alloc->addr, alloc->length});
    return Status::OK();
}

bool ShmTransport::canReach(const SegmentDesc& peer, const RegionDesc& region) const {
    return peer.host_id == localHostId() && !peer.shm_socket.empty() && !region.shm_export.empty();
}

Result<std::shared_ptr<PeerMapping>> ShmTransport::open(const SegmentDesc& peer,
                                                        const ShmExport& alloc, Deadline deadline) {
    ShmRequest request{ShmOp::kOpenAllocation, alloc.alloc_id, host_->secret()};
    uint64_t length = 0;
    auto fd = shmCall(peer.shm_socket, request, deadline, &length);
    if (!fd.ok()) {
        return fd.status().withContext("mapping allocation " + std::to_string(alloc.alloc_id) +
                                       " of segment " + peer.name);
    }
    if (length != alloc.length) {
        return PeerFailure("segment " + peer.name + " allocation " +
                           std::to_string(alloc.alloc_id) + " is " + std::to_string(length) +
                           " bytes; its descriptor says " + std::to_string(alloc.length));
    }
    auto mapping = PeerMapping::map(fd.value(), alloc);
    if (mapping.ok()) {
        MC_LOG(kDebug, "shm") << "mapped " << alloc.length << " bytes of segment " << peer.name
                              << " allocation " << alloc.alloc_id;
    }
    return mapping;
}

Result<ShmTransport::Target> ShmTransport::resolve(const SegmentDesc& peer,
                                                   const RegionDesc& region, uint64_t addr,
                                                   uint64_t len, Deadline deadline) {
    if (stopped_.load(std::memory_order_acquire))
        return Aborted("shm transport shut down");
    if (!canReach(peer, region)) {
        return Unavailable("segment " + peer.name + " is not reachable through shm");
    }
    if (!region.remote_accessible || !region.contains(addr, len)) {
        return OutOfRange("[" + std::to_string(addr) + ", +" + std::to_string(len) +
                          ") is not inside a remotely accessible region of segment " + peer.name);
    }
    auto alloc = decodeShmExport(region.shm_export);
    if (!alloc.ok())
        return alloc.status().withContext("segment " + peer.name);
    if (!alloc->covers(region.addr, region.length)) {
        return InvalidArgument("segment " + peer.name + " exports a region outside its allocation");
    }
    // The socket name is random per engine start, so the key also tells a
    // restarted peer (same name, maybe same pid) from its predecessor.
    std::string key = peer.name + "|" + std::to_string(peer.pid) + "|" + peer.shm_socket + "|" +
                      std::to_string(alloc->alloc_id);
    MC_ASSIGN_OR_RETURN(auto mapping,
                        mappings_.get(key, [&] { return open(peer, alloc.value(), deadline); }));
    const ShmExport& mapped = mapping->alloc();
    if (mapped.base != alloc->base || mapped.length != alloc->length) {
        return PeerFailure("segment " + peer.name + " changed the bounds of allocation " +
                           std::to_string(alloc->alloc_id));
    }
    char* ptr = mapping->translate(addr, len);
    if (!ptr)
        return OutOfRange("range outside the mapped allocation of segment " + peer.name);
    return Target{std::move(mapping), ptr};
}

void ShmTransport::submit(const std::shared_ptr<TransferTask>& task) {
    const TransferRequest& req = task->request();
    const SegmentDesc& peer = task->peer();
    // Re-derive the region instead of trusting the caller: this is the last
    // check before bytes are stored into another process.
    const RegionDesc* region = peer.findRegion(req.target_offset, req.length);
    if (!region) {
        task->complete(OutOfRange("shm: target [" + std::to_string(req.target_offset) + ", +" +
                                  std::to_string(req.length) + ") is not inside a region of " +
                                  peer.name));
        return;
    }
    auto target = resolve(peer, *region, req.target_offset, req.length,
                          Deadline::afterMs(envShmOpenTimeoutMs()));
    if (!target.ok()) {
        task->complete(target.status().withContext("shm transfer"));
        return;
    }
    if (req.opcode == TransferOpcode::kWrite) {
        std::memcpy(target->ptr, req.source, req.length);
    } else {
        std::memcpy(req.source, target->ptr, req.length);
    }
    task->complete(Status::OK());
}

Result<void*> ShmTransport::mapPeerMemory(const SegmentDesc& peer, const RegionDesc& region,
                                          uint64_t addr, uint64_t len) {
    MC_ASSIGN_OR_RETURN(Target target,
                        resolve(peer, region, addr, len, Deadline::afterMs(envShmOpenTimeoutMs())));
    // The cache keeps the mapping alive until shutdown, which is the lifetime
    // promised for mapped pointers.
    return static_cast<void*>(target.ptr);
}

Status ShmTransport::probe(const SegmentDesc& peer, Deadline deadline) {
    if (stopped_.load(std::memory_order_acquire))
        return Aborted("shm transport shut down");
    if (peer.host_id != localHostId() || peer.shm_socket.empty()) {
        return Unavailable("segment " + peer.name + " is not reachable through shm");
    }
    ShmRequest ping{ShmOp::kPing, 0, host_->secret()};
    auto reply = shmCall(peer.shm_socket, ping, deadline, nullptr);
    if (!reply.ok())
        return reply.status().withContext("shm probe of segment " + peer.name);
    return Status::OK();
}

void ShmTransport::shutdown() {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (stopped_.exchange(true, std::memory_order_acq_rel))
        return;
    if (server_)
        server_->stop();
    mappings_.clear();
}

}  // namespace

std::unique_ptr<Transport> createShmTransport() {
    return std::make_unique<ShmTransport>();
}

}  // namespace mooncake::te
