// TransferEngine: registers local memory, publishes it as a named segment in
// a KVStore, and moves bytes to/from peer segments in batches over the best
// transport per peer (cuda_ipc for device memory and shm for host memory on
// the same host; rdma for other hosts when both ends have a usable RDMA
// device, tcp otherwise; MC_FORCE_TCP=1 forces tcp). Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/memory_registry.h"
#include "mooncake-transfer-engine/engine/segment.h"
#include "mooncake-transfer-engine/engine/transfer_request.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::te {

class Transport;
class TransferTask;

struct EngineOptions {
    std::shared_ptr<KVStore> store;
    // Unique among the engines sharing `store` and `key_prefix`.
    std::string segment_name;
    // Shared by every member of the group; connections without it are refused.
    std::string secret;
    std::string key_prefix = "mooncake/te";
    // How long openSegment waits for a peer to publish, by default.
    int64_t open_timeout_ms = 30000;
    // Default true when MC_FORCE_TCP=1.
    bool force_tcp = false;
    // The verbs library the rdma transport loads ("" = libibverbs.so.1).
    std::string verbs_library;
    // Where get_preferred_hca reads the PCIe topology.
    std::string sysfs_root = "/sys";
};

class TransferEngine {
public:
    explicit TransferEngine(EngineOptions options);
    ~TransferEngine();
    TransferEngine(const TransferEngine&) = delete;
    TransferEngine& operator=(const TransferEngine&) = delete;

    // Starts the transports and publishes the (empty) segment. `host_ip` is
    // where listeners bind ("" = 127.0.0.1); `device_filter` limits the NICs an
    // RDMA transport may use (ignored by tcp/shm).
    Status init(const std::string& host_ip, const std::vector<std::string>& device_filter);

    Status registerLocalMemory(void* addr, size_t length, const std::string& location = "cpu",
                               bool remote_accessible = true);
    // Waits (up to `deadline`) until no peer's write is landing in the
    // region any more; writes in flight are failed, new ones refused. On
    // kTimeout the region stays registered and its memory must not be freed.
    Status unregisterLocalMemory(void* addr, Deadline deadline);
    // The same with a deadline of kUnregisterTimeoutMs.
    Status unregisterLocalMemory(void* addr);
    static constexpr int64_t kUnregisterTimeoutMs = 10000;

    // CPU memory that same-host peers can map (memfd). Registered on return;
    // free with freeSharedMemory.
    Result<void*> allocateSharedMemory(size_t length, const std::string& debug_name = "buffer");
    // Device memory on CUDA device `device` that same-host peers can map
    // (cuda_ipc), rounded up to the allocation granularity; registered as
    // "cuda:<device>" on return. kUnavailable without CUDA. Free it with
    // freeSharedMemory.
    Result<void*> allocateDeviceMemory(size_t length, int device);
    Status freeSharedMemory(void* addr);

    Result<SegmentID> openSegment(const std::string& name, Deadline deadline);
    Result<SegmentID> openSegment(const std::string& name);
    Status closeSegment(SegmentID id);
    // Re-reads the peer's descriptor (after it registered more memory).
    Status refreshSegment(SegmentID id, Deadline deadline);
    Result<SegmentDesc> segmentDesc(SegmentID id) const;
    // Name of the transport requests to [addr, addr+len) of `id` would use.
    Result<std::string> transportFor(SegmentID id, uint64_t addr, uint64_t len);

    // Direct load/store pointer to a peer's registered range when the peer is
    // on this host and the range lies in its shared memory; kUnavailable otherwise.
    Result<void*> mapRemote(SegmentID id, uint64_t addr, uint64_t len);

    Result<BatchID> allocateBatchID(size_t capacity);
    // Validates every request before queuing any: a bad request fails the call
    // and nothing is transferred.
    Status submitTransfer(BatchID batch, const std::vector<TransferRequest>& requests);
    Result<TransferStatus> getTransferStatus(BatchID batch, size_t index);
    // Waits for all submitted requests; the first failure, or kTimeout.
    Status waitBatch(BatchID batch, Deadline deadline);
    // Fails with kInvalidArgument while requests are pending.
    Status freeBatchID(BatchID batch);

    Status probePeerAlive(SegmentID id, Deadline deadline);

    // Fails pending requests (kAborted), stops threads, withdraws the segment.
    void shutdown();

    const std::string& segmentName() const { return options_.segment_name; }
    const std::vector<std::string>& deviceFilter() const { return device_filter_; }
    // HCAs the device filter admits (empty without RDMA).
    std::vector<std::string> devices() const { return rdma_devices_; }
    // OK when other-host peers are reached over rdma; else why they use tcp
    // ("no RDMA device ...", "the verbs library is missing ...").
    Status rdmaStatus() const { return rdma_status_; }
    // The HCAs nearest `location`: "cuda:<n>" by PCIe distance to that GPU,
    // "cpu:<n>" on NUMA node n, "cpu" all. Empty without RDMA;
    // kInvalidArgument for another location.
    Result<std::vector<std::string>> preferredHca(const std::string& location) const;

private:
    class Host;
    struct Batch;
    struct OpenSegment {
        std::string name;
        std::shared_ptr<const SegmentDesc> desc;
    };

    Status publishLocked();
    Result<std::shared_ptr<const SegmentDesc>> fetch(const std::string& name, Deadline deadline);
    Result<std::shared_ptr<const SegmentDesc>> descFor(SegmentID id) const;
    // Picks the transport for one validated request; nullptr if none reaches it.
    Transport* select(const SegmentDesc& peer, const RegionDesc& region) const;
    // Sets *refresh_deadline when it first needs to refresh the peer.
    Status validate(const TransferRequest& req, std::shared_ptr<const SegmentDesc>* peer,
                    const RegionDesc** region, std::optional<Deadline>* refresh_deadline);
    std::string segmentKey(const std::string& name) const;

    EngineOptions options_;
    std::vector<std::string> device_filter_;
    std::vector<std::string> rdma_devices_;
    Status rdma_status_ = Unavailable("rdma: engine not started");
    std::string host_ip_;
    std::unique_ptr<Host> host_;
    MemoryRegistry memory_;
    std::vector<std::unique_ptr<Transport>> transports_;  // priority order

    mutable std::mutex mu_;  // guards everything below
    bool started_ = false;
    bool stopped_ = false;
    SegmentDesc local_;
    std::map<SegmentID, OpenSegment> segments_;
    SegmentID next_segment_id_ = 1;
    std::map<BatchID, std::shared_ptr<Batch>> batches_;
    BatchID next_batch_id_ = 1;
};

}  // namespace mooncake::te
