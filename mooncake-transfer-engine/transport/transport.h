// The interface every transport implements. A transport moves the bytes of
// one TransferTask to or from one peer segment. It never throws: failures
// complete the task with a Status; background threads record errors and fail
// pending tasks. Concrete transports are created by the factories in
// transport/<name>/<name>_transport.h and only seen through this interface.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/memory_registry.h"
#include "mooncake-transfer-engine/engine/segment.h"
#include "mooncake-transfer-engine/engine/transfer_request.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::te {

class TransferTask;

// Where threads waiting for the tasks of one batch sleep. Tasks hold it by
// shared_ptr, so a completion racing with freeBatchID never touches freed
// memory. Only a completion that a waiter is blocked on wakes anybody.
class CompletionSignal {
public:
    // Called by `task` once it has left kPending.
    void notify(const TransferTask* task);
    // Blocks until task.done() or the deadline passes; false on timeout.
    bool wait(const TransferTask& task, Deadline deadline);

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<const TransferTask*> awaited_;  // one entry per blocked waiter
    // awaited_.size(), readable without mu_: a completion nobody waits for
    // (the common case) then costs no lock.
    std::atomic<size_t> waiters_{0};
};

// One request in flight. Shared between the engine (status queries) and the
// transport (completion); complete() is called exactly once.
class TransferTask {
public:
    TransferTask(TransferRequest request, std::shared_ptr<const SegmentDesc> peer,
                 std::shared_ptr<CompletionSignal> signal = nullptr)
        : request_(request), peer_(std::move(peer)), signal_(std::move(signal)) {}

    const TransferRequest& request() const { return request_; }
    const SegmentDesc& peer() const { return *peer_; }
    std::shared_ptr<const SegmentDesc> peerPtr() const { return peer_; }

    // First call wins; later calls are ignored (a late reply after a timeout).
    // Wakes a waitBatch() blocked on this task.
    void complete(Status status);
    TransferStatus status() const;
    bool done() const { return state_.load(std::memory_order_acquire) != TransferState::kPending; }

private:
    TransferRequest request_;
    std::shared_ptr<const SegmentDesc> peer_;
    std::shared_ptr<CompletionSignal> signal_;
    std::atomic<TransferState> state_{TransferState::kPending};
    mutable std::mutex mu_;  // guards error_
    Status error_;
};

// What the engine offers its transports.
class TransportHost {
public:
    virtual ~TransportHost() = default;
    virtual MemoryRegistry& memory() = 0;
    // The group secret; a peer must present it before any data is accepted.
    virtual const std::string& secret() const = 0;
    // The address listeners bind to and advertise.
    virtual const std::string& hostIp() const = 0;
    // The local segment name (for error messages and logs).
    virtual const std::string& segmentName() const = 0;
    // The metadata store and the engine's key prefix in it, for transports
    // that exchange connection data per peer (rdma); nullptr when there is none.
    virtual KVStore* store() { return nullptr; }
    virtual const std::string& keyPrefix() const {
        static const std::string none;
        return none;
    }
};

class Transport {
public:
    virtual ~Transport() = default;
    virtual const char* name() const = 0;

    // Starts listeners/threads and writes this transport's endpoint fields
    // into the local descriptor. Called once, before any other call.
    virtual Status start(TransportHost* host, SegmentDesc* local) = 0;

    // Fills the transport's export field of `desc` for a newly registered
    // region (no-op for transports that need none).
    virtual Status exportRegion(const LocalRegion& region, RegionDesc* desc) = 0;
    // The region at `addr` is being unregistered: release what exportRegion
    // took for it (rdma: the memory registration). No request uses it any more.
    virtual void unexportRegion(uint64_t addr) { (void)addr; }

    // True when this transport can move bytes to/from `region` of `peer`.
    virtual bool canReach(const SegmentDesc& peer, const RegionDesc& region) const = 0;

    // Whether the local side of a request may be device memory (the engine
    // refuses such requests for transports that copy with the CPU).
    virtual bool copiesDeviceMemory() const { return false; }

    // Queues the task; the transport completes it (possibly before returning).
    // The request has already been validated against the peer descriptor and
    // the local registry.
    virtual void submit(const std::shared_ptr<TransferTask>& task) = 0;

    // A pointer through which this process can load/store [addr, addr+len)
    // of the peer's region directly (shm, cuda_ipc); kUnavailable otherwise.
    virtual Result<void*> mapPeerMemory(const SegmentDesc& peer, const RegionDesc& region,
                                        uint64_t addr, uint64_t len) {
        (void)peer, (void)region, (void)addr, (void)len;
        return Unavailable(std::string(name()) + " cannot map peer memory");
    }

    // `region` is being unregistered (the registry already refuses new
    // remote uses of it): stop landing peers' writes in it now, failing
    // them, so that the uses they hold are released promptly. Transports
    // whose peers never write through the registry do nothing.
    virtual void abortRemoteAccess(const LocalRegion& region) { (void)region; }

    // Whether the peer process answers before the deadline.
    virtual Status probe(const SegmentDesc& peer, Deadline deadline) = 0;

    // Fails pending tasks with kAborted and joins threads. Idempotent.
    virtual void shutdown() = 0;
};

}  // namespace mooncake::te
