#include "mooncake-pg/device/group_window.h"

#include <atomic>

#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "mooncake-pg/device/published_region.h"
#include "mooncake-pg/device/routing.h"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::pg::device {

GroupWindow::GroupWindow(te::TransferEngine& engine, KVStore& store, GroupWindowOptions options)
    : engine_(engine), store_(store), options_(std::move(options)) {}

Result<std::unique_ptr<GroupWindow>> GroupWindow::create(te::TransferEngine& engine, KVStore& store,
                                                         GroupWindowOptions options) {
    std::unique_ptr<GroupWindow> w(new GroupWindow(engine, store, std::move(options)));
    MC_RETURN_IF_ERROR(w->init());
    return w;
}

std::string GroupWindow::addressKey(const std::string& prefix, const std::string& segment) {
    return prefix + "/cuda_window/" + segment;
}

Status GroupWindow::init() {
    MC_ASSIGN_OR_RETURN(window_bytes_,
                        groupWindowBytes(options_.max_group_size, options_.slot_bytes));
    MC_RETURN_IF_ERROR(
        cudaStatus(cudaSetDevice(options_.cuda_device), "selecting the group's GPU"));
    auto window = engine_.allocateDeviceMemory(window_bytes_, options_.cuda_device);
    if (!window.ok()) {
        return window.status().withContext("allocating the group's " +
                                           std::to_string(window_bytes_) +
                                           "-byte device window (cuda_ipc)");
    }
    window_ = static_cast<char*>(window.value());
    // Peers read flags from the first call on: zero before publishing. A
    // private stream, so the wait covers this memset only.
    cudaStream_t s = nullptr;
    MC_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                  "creating a stream to clear the device window"));
    cudaError_t e = cudaMemsetAsync(window_, 0, window_bytes_, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    MC_RETURN_IF_ERROR(cudaStatus(e, "clearing the device window"));

    void* words = nullptr;
    MC_RETURN_IF_ERROR(cudaStatus(cudaHostAlloc(&words, 4096, cudaHostAllocMapped),
                                  "allocating the host-mapped abort/epoch/result words"));
    std::memset(words, 0, 4096);
    host_words_ = static_cast<uint64_t*>(words);
    void* dev = nullptr;
    MC_RETURN_IF_ERROR(cudaStatus(cudaHostGetDevicePointer(&dev, words, 0),
                                  "mapping the abort/epoch/result words"));
    device_words_ = static_cast<const volatile uint64_t*>(dev);
    static_assert(
        kResultWord * sizeof(uint64_t) + (kGraphResultSlot + 1) * sizeof(DeviceOpResult) <= 4096,
        "the result slots must fit the host-mapped page");
    device_results_ = reinterpret_cast<DeviceOpResult*>(static_cast<uint64_t*>(dev) + kResultWord);

    // Peers check the layout before they map: every member must have the
    // same slot size (MC_PG_CUDA_SLOT_BYTES) and reservation.
    return publishRegion(store_, addressKey(options_.key_prefix, options_.segment),
                         {reinterpret_cast<uint64_t>(window_), options_.slot_bytes, window_bytes_});
}

GroupWindow::~GroupWindow() {
    if (window_) {
        Status st = engine_.freeSharedMemory(window_);
        (void)st;  // the engine's shutdown releases what is left
    }
    if (host_words_)
        cudaFreeHost(host_words_);
}

Result<char*> GroupWindow::mapPeer(const std::string& segment, Deadline deadline) {
    auto it = mapped_.find(segment);
    if (it != mapped_.end())
        return it->second;
    MC_ASSIGN_OR_RETURN(const PublishedRegion region,
                        readRegion(store_, addressKey(options_.key_prefix, segment),
                                   "device window of peer segment '" + segment + "'", deadline));
    const uint64_t slot = region.unit, bytes = region.bytes;
    if (slot != options_.slot_bytes || bytes != window_bytes_) {
        return InvalidArgument("peer segment '" + segment + "' has a device window of " +
                               std::to_string(bytes) + " bytes with " + std::to_string(slot) +
                               "-byte slots, this rank " + std::to_string(window_bytes_) +
                               " bytes with " + std::to_string(options_.slot_bytes) +
                               "-byte slots; every rank must set the same " + kCudaSlotBytesEnv);
    }
    auto mapped = mapRegion(engine_, segment, region.addr, window_bytes_, deadline);
    if (!mapped.ok()) {
        return mapped.status().withContext("mapping the device window of peer segment '" + segment +
                                           "'");
    }
    char* p = mapped.value();
    mapped_.emplace(segment, p);
    return p;
}

Status GroupWindow::applyView(const std::vector<std::string>& segments, uint64_t epoch,
                              Deadline deadline) {
    const int size = static_cast<int>(segments.size());
    if (size < 1 || size > options_.max_group_size || options_.rank >= size) {
        return InvalidArgument("device view of " + std::to_string(size) + " ranks for rank " +
                               std::to_string(options_.rank) + " of a window for " +
                               std::to_string(options_.max_group_size));
    }
    if (epoch == 0)
        return InvalidArgument(
            "device view epoch must be >= 1 (tags of epoch 0 match cleared flags)");
    DeviceGroupView v;
    v.rank = options_.rank;
    v.size = size;
    v.slot_bytes = options_.slot_bytes;
    for (int p = 0; p < size; ++p) {
        if (p == options_.rank) {
            v.windows[p] = window_;
            continue;
        }
        auto mapped = mapPeer(segments[p], deadline);
        if (!mapped.ok()) {
            return mapped.status().withContext("setting up the device view of epoch " +
                                               std::to_string(epoch) + " (rank " +
                                               std::to_string(p) + ")");
        }
        v.windows[p] = mapped.value();
    }
    v.epoch = epoch;
    v.current_epoch = device_words_ + 1;
    v.abort_word = device_words_;
    v.seq_on_device = true;
    reinterpret_cast<volatile uint64_t*>(host_words_)[1] = epoch;
    noteCommittedEpoch(epoch);
    view_ = v;
    // Every member restarts at the same point: the first call of the epoch.
    restart_seq_ = true;
    return Status::OK();
}

Result<DeviceGroupView> GroupWindow::nextCall(int64_t timeout_ns, cudaStream_t stream,
                                              bool captured) {
    if (!hasView())
        return Internal("device call before the group's device view was set up");
    DeviceGroupView v = view_;
    v.timeout_ns = timeout_ns;
    if (captured) {
        if (restart_seq_) {
            return InvalidArgument(
                "the first device call of a membership epoch cannot be captured in a CUDA graph "
                "(it restarts the call numbering, which a replay must not repeat)");
        }
        v.current_epoch = device_words_ + kCommittedEpochWord;
        return v;
    }
    if (restart_seq_) {
        MC_RETURN_IF_ERROR(
            cudaStatus(cudaMemsetAsync(window_ + kCallSeqOffset, 0, sizeof(uint64_t), stream),
                       "restarting the device call counter"));
        restart_seq_ = false;
    }
    return v;
}

void GroupWindow::noteCommittedEpoch(uint64_t epoch) {
    uint64_t seen = __atomic_load_n(host_words_ + kCommittedEpochWord, __ATOMIC_SEQ_CST);
    while (seen < epoch &&
           !__atomic_compare_exchange_n(host_words_ + kCommittedEpochWord, &seen, epoch, false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

DeviceOpResult GroupWindow::hostResult(int slot) const {
    // Written by the device: read each field once, through volatile, the
    // status first (the kernels write it last).
    const auto* r =
        reinterpret_cast<const volatile DeviceOpResult*>(host_words_ + kResultWord) + slot;
    DeviceOpResult out;
    out.status = r->status;
    if (out.status == static_cast<int32_t>(DeviceStatus::kClaimed)) {
        out.status = 0;  // its fields are on their way: none yet
        return out;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    out.culprit = r->culprit;
    out.detail = r->detail;
    return out;
}

bool GroupWindow::callEnded(int slot) const {
    const auto* r =
        reinterpret_cast<const volatile DeviceOpResult*>(host_words_ + kResultWord) + slot;
    const bool ended = r->ended != 0;
    // The kernels fenced the result before the mark: read it after this.
    std::atomic_thread_fence(std::memory_order_acquire);
    return ended;
}

void GroupWindow::clearResult(int slot) {
    auto* r = reinterpret_cast<volatile DeviceOpResult*>(host_words_ + kResultWord) + slot;
    r->status = 0;
    r->culprit = -1;
    r->detail = 0;
    r->ended = 0;
}

void GroupWindow::setAbort(uint64_t reason) {
    // The first reason wins: later evidence must not rename the failure.
    uint64_t expected = 0;
    __atomic_compare_exchange_n(host_words_, &expected, reason, false, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
}

uint64_t GroupWindow::abortReason() const {
    return __atomic_load_n(host_words_, __ATOMIC_SEQ_CST);
}

void GroupWindow::clearAbort() {
    __atomic_store_n(host_words_, 0, __ATOMIC_SEQ_CST);
}

}  // namespace mooncake::pg::device
