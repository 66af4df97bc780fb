// GroupWindow: one process's device state for a group's device collectives
// (device_group.h), torch-free.
//
//   * its window: exportable device memory from the group's transfer engine
//     (cuda_ipc), sized once for every size the group may grow to
//     (routing.h groupWindowBytes), zeroed, its address published in the
//     group's store under the engine's segment name;
//   * the peers' windows, mapped through the same engine, so the group
//     secret guards the exchange; one mapping per peer process (segment),
//     kept until destruction, so a view change re-maps only newcomers;
//   * host-mapped words the kernels read: the abort word, the group's
//     current epoch, the latest committed epoch (for calls replayed from a
//     CUDA graph), a ring of call results (calls queued back to back each
//     write their own, so the host reads them after the fact) and the
//     graph calls' sticky result.
//
// The torch layer creates it at the group's first kernel collective (every
// member reaches that call, so the exchange is collective) and calls
// applyView before each call whose membership epoch differs from the one
// the window was last set up for. Not thread-safe, except setAbort.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/routing.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg::device {

struct GroupWindowOptions {
    int rank = 0;
    // The group's reserved slots: the window holds that many sources.
    int max_group_size = 0;
    int cuda_device = 0;
    uint64_t slot_bytes = 0;
    // Store key prefix unique to the group instance.
    std::string key_prefix;
    // This process's engine segment (peers map the window through it).
    std::string segment;
};

class GroupWindow {
public:
    // Allocates and publishes this rank's window; the engine and store must
    // outlive the window.
    static Result<std::unique_ptr<GroupWindow>> create(te::TransferEngine& engine, KVStore& store,
                                                       GroupWindowOptions options);
    ~GroupWindow();
    GroupWindow(const GroupWindow&) = delete;
    GroupWindow& operator=(const GroupWindow&) = delete;

    // Sets the group up for the members `segments` (rank order, size =
    // segments.size(), this rank's own entry ignored) in membership epoch
    // `epoch` (>= 1): maps every member's window not mapped yet (waiting
    // for its address until `deadline`), publishes `epoch` as the current
    // one and restarts the call sequence (the next call queued outside a
    // graph zeroes the call counter first).
    Status applyView(const std::vector<std::string>& segments, uint64_t epoch, Deadline deadline);
    bool hasView() const { return view_.size > 0; }
    uint64_t epoch() const { return view_.epoch; }
    int size() const { return view_.size; }

    // The view of the next call, queued on `stream`, with the kernels'
    // deadline. Its number comes from the call counter on the device
    // (seq_on_device: pass seq 0), so every member must queue the same
    // calls. The first call of an epoch zeroes the counter on `stream`
    // before it.
    //
    // `captured`: the call is being captured into a CUDA graph. Its kernels
    // compare the epoch with the latest committed one (noteCommittedEpoch),
    // so a replay after any membership change fails without touching a peer,
    // and report to the graph result (graphResult). A capture cannot start
    // an epoch (the zeroing would replay with it): that is refused.
    Result<DeviceGroupView> nextCall(int64_t timeout_ns, cudaStream_t stream,
                                     bool captured = false);

    // Result slots: calls in flight at once each hold one until the host
    // has read it, so at most this many calls are queued unread.
    static constexpr int kResultSlots = kMaxKernelCallsInFlight;
    // A call's result (slot in [0, kResultSlots)), as the host reads it once
    // the call has ended and as the kernels write it.
    DeviceOpResult hostResult(int slot = 0) const;
    DeviceOpResult* deviceResult(int slot = 0) const { return device_results_ + slot; }
    void clearResult(int slot = 0);
    // Any thread: whether the call holding `slot` has ended on the device
    // (DeviceOpResult::ended; its result may be read from then on). A plain
    // read of host memory: no CUDA call.
    bool callEnded(int slot) const;

    // Calls replayed from CUDA graphs report here, first failure wins, until
    // the host reads and clears it.
    static constexpr int kGraphResultSlot = kResultSlots;
    DeviceOpResult graphResult() const { return hostResult(kGraphResultSlot); }
    void clearGraphResult() { clearResult(kGraphResultSlot); }

    // Any thread: the control plane committed membership `epoch` (in the
    // kernels' numbering, as applyView takes it). Graph calls captured in an
    // older one fail from then on. Only ever raised.
    void noteCommittedEpoch(uint64_t epoch);

    // Any thread: evidence of a failure (routing.h kAbort*); the first
    // nonzero reason stays until clearAbort.
    void setAbort(uint64_t reason);
    uint64_t abortReason() const;
    void clearAbort();

    uint64_t windowBytes() const { return window_bytes_; }
    static std::string addressKey(const std::string& prefix, const std::string& segment);

private:
    GroupWindow(te::TransferEngine& engine, KVStore& store, GroupWindowOptions options);
    Status init();
    Result<char*> mapPeer(const std::string& segment, Deadline deadline);

    te::TransferEngine& engine_;
    KVStore& store_;
    const GroupWindowOptions options_;
    uint64_t window_bytes_ = 0;
    char* window_ = nullptr;
    // Host-mapped: [0] abort word, [1] current epoch, [2] latest committed
    // epoch, from kResultWord the result slots, then the graph result.
    static constexpr int kCommittedEpochWord = 2;
    static constexpr int kResultWord = 8;
    uint64_t* host_words_ = nullptr;
    const volatile uint64_t* device_words_ = nullptr;
    DeviceOpResult* device_results_ = nullptr;
    std::map<std::string, char*> mapped_;  // by peer segment
    DeviceGroupView view_;
    // Set by applyView: the next call zeroes the call counter.
    bool restart_seq_ = false;
};

}  // namespace mooncake::pg::device
