// DevicePools: the P2PMover (core/p2p_mover.h) of a group's P2P on CUDA
// tensors, torch-free.
//
//   * this rank's receive pools: one device allocation from the group's
//     transfer engine (cuda_ipc), one pool per sender slot of the group,
//     its address published in the store under the engine's segment name;
//   * the peers' pools, mapped through the same engine when a put first
//     needs them (the peer published them before it granted the credit),
//     one mapping per peer process, so a replacement is mapped anew;
//   * one copy stream: puts copy from the user's tensor straight into the
//     peer's pool, takes from this rank's pool into the user's tensor, in
//     queue order, each followed by an event the engine polls.
//
// Stream order with the caller: orderAfter(stream), on the caller's thread
// when the op is posted, records the work already on the caller's stream
// (the producer of a send, the last reader of a recv's tensor); the engine
// queues the op's copies once that has run (ready()), so they wait for
// nothing the caller queued later, and no copy on the one stream waits
// behind another op's predecessors. The engine
// completes an op only once its copies have, so its tensors are free (and a
// recv's data visible) when the Work completes.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mooncake-pg/core/p2p_mover.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg::device {

struct DevicePoolsOptions {
    int rank = 0;
    // Sender slots: the group's reserved slots.
    int max_group_size = 0;
    int cuda_device = 0;
    uint64_t pool_bytes_per_peer = 0;
    // Copies by a kernel instead of cudaMemcpyAsync (MC_PG_CUDA_P2P_COPY).
    bool copy_with_kernel = false;
    // Store key prefix unique to the group instance.
    std::string key_prefix;
    // This process's engine segment (peers map the pools through it).
    std::string segment;
};

class DevicePools final : public P2PMover {
public:
    // Allocates and publishes this rank's pools. `owner` keeps the engine
    // and the store alive as long as this object.
    static Result<std::shared_ptr<DevicePools>> create(std::shared_ptr<void> owner,
                                                       te::TransferEngine& engine, KVStore& store,
                                                       DevicePoolsOptions options);
    ~DevicePools() override;
    DevicePools(const DevicePools&) = delete;
    DevicePools& operator=(const DevicePools&) = delete;

    // Any thread: the engine segment of each rank's process (rank order,
    // empty where unknown), from the membership view. A rank whose segment
    // changed is mapped again at its next put.
    void setPeerSegments(std::vector<std::string> segments);

    // Caller's thread: the order of an op posted now (P2PMover's P2POrder):
    // its copies wait for the work queued on `stream` so far.
    Result<std::shared_ptr<const P2POrder>> orderAfter(cudaStream_t stream);

    Result<uint64_t> put(int peer, uint64_t pool_offset, const void* src, size_t bytes,
                         const P2POrder* order) override;
    Result<uint64_t> take(int peer, uint64_t pool_offset, void* dst, size_t bytes,
                          const P2POrder* order) override;
    // Whether the caller's stream has passed the point orderAfter recorded.
    bool ready(const P2POrder* order) override;
    Result<bool> completed(uint64_t ticket) override;
    Status drain(Deadline deadline) override;

    static std::string addressKey(const std::string& prefix, const std::string& segment);
    uint64_t poolsBytes() const { return pools_bytes_; }
    // The copy stream: an event recorded on it after an op completed
    // follows the op's copies.
    cudaStream_t stream() const { return stream_; }
    // Tensors were recorded on the stream (the caching allocator's
    // record_stream): it must outlive this object, so it is never destroyed.
    void streamInUse() { stream_in_use_.store(true); }

private:
    DevicePools(std::shared_ptr<void> owner, te::TransferEngine& engine, KVStore& store,
                DevicePoolsOptions options);
    Status init();
    // mu_ held: the pool `peer` keeps for this rank, mapped on first use.
    Result<char*> peerPoolLocked(int peer);
    // mu_ held: queues the copy (after `order`) and the event that marks it.
    Result<uint64_t> copyLocked(void* dst, const void* src, size_t bytes, const P2POrder* order,
                                const char* what);
    // mu_ held: retires the copies whose events have completed.
    Status reapLocked();
    Result<cudaEvent_t> eventLocked();

    const std::shared_ptr<void> owner_;
    te::TransferEngine& engine_;
    KVStore& store_;
    const DevicePoolsOptions options_;
    uint64_t pools_bytes_ = 0;
    char* pools_ = nullptr;
    cudaStream_t stream_ = nullptr;
    std::atomic<bool> stream_in_use_{false};

    std::mutex mu_;
    std::vector<std::string> segments_;    // by rank
    std::map<std::string, char*> mapped_;  // peer segment -> its pools
    // Queued copies not yet seen complete: (ticket, event), queue order.
    std::deque<std::pair<uint64_t, cudaEvent_t>> pending_;
    std::vector<cudaEvent_t> spare_events_;
    uint64_t queued_ = 0;
    uint64_t done_ = 0;
    Status broken_;             // a copy that failed: every later query fails
};

}  // namespace mooncake::pg::device
