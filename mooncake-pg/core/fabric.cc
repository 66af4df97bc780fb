#include "mooncake-pg/core/fabric.h"

#include <atomic>
#include <cstring>
#include <string>

namespace mooncake::pg {

uint64_t loadFlag(const uint8_t* window, uint64_t offset) {
    return std::atomic_ref<const uint64_t>(*reinterpret_cast<const uint64_t*>(window + offset))
        .load(std::memory_order_acquire);
}

class ThreadFabric : public Fabric {
public:
    ThreadFabric(ThreadFabricGroup* group, int rank) : group_(group), rank_(rank) {}

    int rank() const override { return rank_; }
    int size() const override { return group_->size_; }
    size_t windowBytes() const override { return group_->window_bytes_; }
    uint8_t* localWindow() override { return group_->windows_[rank_].get(); }

    // Plain stores: nothing to wait for, so the deadline is unused.
    Status put(int peer, uint64_t offset, const void* src, size_t len, Deadline) override {
        MC_RETURN_IF_ERROR(check(peer, offset, len));
        std::memcpy(group_->windows_[peer].get() + offset, src, len);
        return Status::OK();
    }

    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline) override {
        MC_RETURN_IF_ERROR(check(peer, offset, sizeof(uint64_t)));
        std::atomic_ref<uint64_t>(
            *reinterpret_cast<uint64_t*>(group_->windows_[peer].get() + offset))
            .store(value, std::memory_order_release);
        return Status::OK();
    }

    uint8_t* peerWindow(int peer) override {
        if (peer < 0 || peer >= group_->size_ || group_->dead_[peer].load())
            return nullptr;
        return group_->windows_[peer].get();
    }

    bool peerFailed(int peer) const override { return group_->dead_[peer].load(); }

private:
    Status check(int peer, uint64_t offset, size_t len) const {
        if (peer < 0 || peer >= group_->size_) {
            return InvalidArgument("peer " + std::to_string(peer) + " outside [0, " +
                                   std::to_string(group_->size_) + ")");
        }
        if (offset > group_->window_bytes_ || len > group_->window_bytes_ - offset) {
            return OutOfRange("put [" + std::to_string(offset) + ", +" + std::to_string(len) +
                              ") outside the " + std::to_string(group_->window_bytes_) +
                              "-byte window");
        }
        if (group_->dead_[peer].load() || group_->dead_[rank_].load()) {
            return PeerFailure("rank " + std::to_string(peer) + " is dead");
        }
        return Status::OK();
    }

    ThreadFabricGroup* group_;
    int rank_;
};

SoloFabric::SoloFabric(int rank, int size, size_t window_bytes)
    : rank_(rank), size_(size), window_bytes_(window_bytes), window_(new uint8_t[window_bytes]()) {}

Status SoloFabric::put(int peer, uint64_t, const void*, size_t, Deadline) {
    return Unavailable("rank " + std::to_string(rank_) + " is on its own: no put to rank " +
                       std::to_string(peer));
}

Status SoloFabric::putFlag(int peer, uint64_t offset, uint64_t, Deadline deadline) {
    return put(peer, offset, nullptr, 0, deadline);
}

ThreadFabricGroup::ThreadFabricGroup(int size, size_t window_bytes)
    : size_(size), window_bytes_(window_bytes), dead_(new std::atomic<bool>[size]) {
    for (int r = 0; r < size; ++r) {
        windows_.emplace_back(new uint8_t[window_bytes]());
        dead_[r].store(false);
    }
    for (int r = 0; r < size; ++r)
        fabrics_.push_back(std::make_shared<ThreadFabric>(this, r));
}

std::shared_ptr<Fabric> ThreadFabricGroup::fabric(int rank) {
    return fabrics_.at(rank);
}

void ThreadFabricGroup::kill(int rank) {
    dead_[rank].store(true);
}

}  // namespace mooncake::pg
