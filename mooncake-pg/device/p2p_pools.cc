#include "mooncake-pg/device/p2p_pools.h"

#include <sched.h>

#include <utility>

#include "mooncake-pg/device/copy_bytes.h"
#include "mooncake-pg/device/published_region.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::pg::device {

namespace {

// A peer published its pools before it granted the credit that makes this
// rank map them, so the store answers at once; the bound covers opening
// the peer's segment.
constexpr int64_t kMapTimeoutMs = 10000;

// Makes `device` current for a scope. On a user's thread (`restore`) the
// thread's own device comes back after; the P2P progress thread, which is
// ours, keeps it: restoring the default device there would create a context
// on GPU 0 in every process of a multi-GPU host.
class DeviceScope {
public:
    explicit DeviceScope(int device, bool restore = true) {
        int current = -1;
        if (cudaGetDevice(&current) == cudaSuccess && current == device)
            return;
        saved_ = restore ? current : -1;
        status_ = cudaStatus(cudaSetDevice(device), "selecting the group's GPU");
    }
    ~DeviceScope() {
        if (saved_ >= 0)
            cudaSetDevice(saved_);
    }
    const Status& status() const { return status_; }

private:
    int saved_ = -1;
    Status status_;
};

// An op's place in its caller's stream: an event recorded there at post.
class StreamOrder final : public P2POrder {
public:
    StreamOrder(int device, cudaEvent_t event) : device(device), event(event) {}
    ~StreamOrder() override {
        DeviceScope scope(device);
        cudaEventDestroy(event);
    }
    const int device;
    const cudaEvent_t event;
};

// How long the destructor waits for copies still queued (the engine drained
// them already; this covers a drain that failed).
constexpr int64_t kTeardownWaitMs = 5000;

}  // namespace

DevicePools::DevicePools(std::shared_ptr<void> owner, te::TransferEngine& engine, KVStore& store,
                         DevicePoolsOptions options)
    : owner_(std::move(owner)), engine_(engine), store_(store), options_(std::move(options)) {}

Result<std::shared_ptr<DevicePools>> DevicePools::create(std::shared_ptr<void> owner,
                                                         te::TransferEngine& engine, KVStore& store,
                                                         DevicePoolsOptions options) {
    std::shared_ptr<DevicePools> pools(
        new DevicePools(std::move(owner), engine, store, std::move(options)));
    MC_RETURN_IF_ERROR(pools->init());
    return pools;
}

std::string DevicePools::addressKey(const std::string& prefix, const std::string& segment) {
    return prefix + "/cuda_p2p_pools/" + segment;
}

Status DevicePools::init() {
    if (options_.max_group_size < 1 || options_.pool_bytes_per_peer == 0) {
        return InvalidArgument("device P2P pools for " + std::to_string(options_.max_group_size) +
                               " ranks of " + std::to_string(options_.pool_bytes_per_peer) +
                               " bytes");
    }
    pools_bytes_ = options_.pool_bytes_per_peer * static_cast<uint64_t>(options_.max_group_size);
    DeviceScope scope(options_.cuda_device);
    MC_RETURN_IF_ERROR(scope.status());
    auto pools = engine_.allocateDeviceMemory(pools_bytes_, options_.cuda_device);
    if (!pools.ok()) {
        return pools.status().withContext("allocating the group's " + std::to_string(pools_bytes_) +
                                          "-byte device P2P pools (cuda_ipc)");
    }
    pools_ = static_cast<char*>(pools.value());
    MC_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                  "creating the P2P copy stream"));
    // Peers check the layout before they map: every rank must reserve the
    // same pool per sender.
    return publishRegion(
        store_, addressKey(options_.key_prefix, options_.segment),
        {reinterpret_cast<uint64_t>(pools_), options_.pool_bytes_per_peer, pools_bytes_});
}

DevicePools::~DevicePools() {
    DeviceScope scope(options_.cuda_device);
    if (stream_ != nullptr) {
        // Bounded: the pools are freed below whatever a stalled stream does
        // (the engine has failed every op by now, and logged it).
        Status st = drain(Deadline::afterMs(kTeardownWaitMs));
        (void)st;
        // A stream the caching allocator knows (streamInUse) stays: freeing
        // a tensor recorded on it records an event there, even after the
        // group is gone. One stream per group that ran P2P on the device.
        if (!stream_in_use_.load())
            cudaStreamDestroy(stream_);
    }
    for (auto& [ticket, event] : pending_)
        cudaEventDestroy(event);
    for (cudaEvent_t e : spare_events_)
        cudaEventDestroy(e);
    if (pools_ != nullptr) {
        Status st = engine_.freeSharedMemory(pools_);
        (void)st;  // the engine's shutdown releases what is left
    }
}

void DevicePools::setPeerSegments(std::vector<std::string> segments) {
    std::lock_guard<std::mutex> lock(mu_);
    segments_ = std::move(segments);
}

Result<cudaEvent_t> DevicePools::eventLocked() {
    if (!spare_events_.empty()) {
        cudaEvent_t e = spare_events_.back();
        spare_events_.pop_back();
        return e;
    }
    cudaEvent_t e = nullptr;
    MC_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                  "creating a P2P copy event"));
    return e;
}

Result<std::shared_ptr<const P2POrder>> DevicePools::orderAfter(cudaStream_t stream) {
    DeviceScope scope(options_.cuda_device);
    MC_RETURN_IF_ERROR(scope.status());
    cudaEvent_t e = nullptr;
    MC_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                  "creating a P2P order event"));
    auto order = std::make_shared<const StreamOrder>(options_.cuda_device, e);
    MC_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(e, stream), "recording the caller's stream"));
    return std::shared_ptr<const P2POrder>(std::move(order));
}

Result<char*> DevicePools::peerPoolLocked(int peer) {
    if (peer < 0 || peer >= options_.max_group_size || peer == options_.rank) {
        return InvalidArgument("device P2P pool of rank " + std::to_string(peer));
    }
    const std::string segment =
        static_cast<size_t>(peer) < segments_.size() ? segments_[peer] : std::string();
    if (segment.empty())
        return Unavailable("rank " + std::to_string(peer) + " has no known engine segment");
    auto it = mapped_.find(segment);
    if (it == mapped_.end()) {
        const Deadline deadline = Deadline::afterMs(kMapTimeoutMs);
        MC_ASSIGN_OR_RETURN(
            const PublishedRegion region,
            readRegion(store_, addressKey(options_.key_prefix, segment),
                       "device P2P pools of rank " + std::to_string(peer), deadline));
        const uint64_t per_peer = region.unit, bytes = region.bytes;
        if (per_peer != options_.pool_bytes_per_peer || bytes != pools_bytes_) {
            return InvalidArgument("rank " + std::to_string(peer) + " has device P2P pools of " +
                                   std::to_string(per_peer) + " bytes per sender, this rank " +
                                   std::to_string(options_.pool_bytes_per_peer) +
                                   "; every rank must set the same MC_PG_CUDA_P2P_POOL_BYTES");
        }
        auto mapped = mapRegion(engine_, segment, region.addr, pools_bytes_, deadline);
        if (!mapped.ok()) {
            return mapped.status().withContext(
                "mapping the device P2P pools of rank " + std::to_string(peer) +
                " (CUDA P2P on device pools needs every member on this host; set "
                "MC_PG_CUDA_PATH=staged for groups that span hosts)");
        }
        it = mapped_.emplace(segment, mapped.value()).first;
    }
    return it->second + static_cast<uint64_t>(options_.rank) * options_.pool_bytes_per_peer;
}

Result<uint64_t> DevicePools::copyLocked(void* dst, const void* src, size_t bytes,
                                         const P2POrder* order, const char* what) {
    MC_RETURN_IF_ERROR(broken_);
    DeviceScope scope(options_.cuda_device, /*restore=*/false);
    MC_RETURN_IF_ERROR(scope.status());
    // The engine queues an op's copies only once ready(order) said so:
    // nothing on this one stream ever waits for a caller's work.
    (void)order;
    MC_ASSIGN_OR_RETURN(cudaEvent_t e, eventLocked());
    Status st =
        options_.copy_with_kernel
            ? launchCopyBytes(dst, src, bytes, stream_).withContext(what)
            : cudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), what);
    if (st.ok())
        st = cudaStatus(cudaEventRecord(e, stream_), what);
    if (!st.ok()) {
        spare_events_.push_back(e);
        broken_ = st;
        return st;
    }
    pending_.emplace_back(++queued_, e);
    return queued_;
}

Result<uint64_t> DevicePools::put(int peer, uint64_t pool_offset, const void* src, size_t bytes,
                                  const P2POrder* order) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pool_offset > options_.pool_bytes_per_peer ||
        bytes > options_.pool_bytes_per_peer - pool_offset) {
        return InvalidArgument("P2P put of " + std::to_string(bytes) + " bytes at offset " +
                               std::to_string(pool_offset) + " of a " +
                               std::to_string(options_.pool_bytes_per_peer) + "-byte pool");
    }
    MC_ASSIGN_OR_RETURN(char* pool, peerPoolLocked(peer));
    return copyLocked(pool + pool_offset, src, bytes, order, "queuing a P2P put");
}

Result<uint64_t> DevicePools::take(int peer, uint64_t pool_offset, void* dst, size_t bytes,
                                   const P2POrder* order) {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer < 0 || peer >= options_.max_group_size || pool_offset > options_.pool_bytes_per_peer ||
        bytes > options_.pool_bytes_per_peer - pool_offset) {
        return InvalidArgument("P2P take of " + std::to_string(bytes) + " bytes at offset " +
                               std::to_string(pool_offset) + " of rank " + std::to_string(peer) +
                               "'s pool");
    }
    const char* pool = pools_ + static_cast<uint64_t>(peer) * options_.pool_bytes_per_peer;
    return copyLocked(dst, pool + pool_offset, bytes, order, "queuing a P2P copy out of the pool");
}

Status DevicePools::reapLocked() {
    MC_RETURN_IF_ERROR(broken_);
    while (!pending_.empty()) {
        const cudaError_t e = cudaEventQuery(pending_.front().second);
        if (e == cudaErrorNotReady)
            return Status::OK();
        if (e != cudaSuccess) {
            broken_ = cudaStatus(e, "a P2P copy failed");
            return broken_;
        }
        done_ = pending_.front().first;
        spare_events_.push_back(pending_.front().second);
        pending_.pop_front();
    }
    return Status::OK();
}

bool DevicePools::ready(const P2POrder* order) {
    const auto* caller = dynamic_cast<const StreamOrder*>(order);
    if (caller == nullptr)
        return true;
    DeviceScope scope(options_.cuda_device, /*restore=*/false);
    // An error here is the device's: the copy queued next reports it.
    return cudaEventQuery(caller->event) != cudaErrorNotReady;
}

Result<bool> DevicePools::completed(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ >= ticket)
        return true;
    DeviceScope scope(options_.cuda_device, /*restore=*/false);
    MC_RETURN_IF_ERROR(scope.status());
    MC_RETURN_IF_ERROR(reapLocked());
    return done_ >= ticket;
}

Status DevicePools::drain(Deadline deadline) {
    DeviceScope scope(options_.cuda_device);
    MC_RETURN_IF_ERROR(scope.status());
    while (true) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            // Even when a copy failed, the ones queued before it may still
            // run: each counts as done once its event no longer reads as
            // pending, whatever the query says.
            while (!pending_.empty()) {
                const cudaError_t e = cudaEventQuery(pending_.front().second);
                if (e == cudaErrorNotReady)
                    break;
                if (e != cudaSuccess && broken_.ok())
                    broken_ = cudaStatus(e, "a P2P copy failed");
                if (broken_.ok())
                    done_ = pending_.front().first;
                spare_events_.push_back(pending_.front().second);
                pending_.pop_front();
            }
            if (pending_.empty())
                return Status::OK();  // a failed copy is reported by completed()
        }
        if (deadline.expired())
            return Timeout("P2P copies still queued on the device");
        sched_yield();
    }
}

}  // namespace mooncake::pg::device
