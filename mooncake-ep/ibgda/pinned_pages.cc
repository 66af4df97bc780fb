#include "mooncake-ep/ibgda/pinned_pages.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

namespace mooncake::ep {

PinnedPages::PinnedPages(Register reg, Unregister unreg)
    : register_(std::move(reg)), unregister_(std::move(unreg)) {}

std::map<uintptr_t, PinnedPages::Run>::iterator PinnedPages::firstEndingAfter(uintptr_t addr) {
    auto it = runs_.upper_bound(addr);
    if (it != runs_.begin() && std::prev(it)->second.end > addr)
        --it;
    return it;
}

Result<std::vector<uintptr_t>> PinnedPages::acquire(uintptr_t begin, uintptr_t end, bool io) {
    if (end <= begin)
        return InvalidArgument("pinning an empty range of host pages");
    std::lock_guard<std::mutex> lock(mu_);
    // The gaps no registration covers, then the registrations that overlap.
    std::vector<std::pair<uintptr_t, uintptr_t>> gaps;
    uintptr_t cursor = begin;
    for (auto run = firstEndingAfter(begin); run != runs_.end() && run->first < end; ++run) {
        if (run->first > cursor)
            gaps.emplace_back(cursor, run->first);
        cursor = std::max(cursor, run->second.end);
    }
    if (cursor < end)
        gaps.emplace_back(cursor, end);
    std::vector<uintptr_t> added;
    for (const auto& [gap_begin, gap_end] : gaps) {
        Result<bool> ours = register_(gap_begin, gap_end - gap_begin, io);
        if (!ours.ok()) {
            for (uintptr_t a : added) {
                if (runs_.at(a).ours)
                    unregister_(a);
                runs_.erase(a);
            }
            return ours.status();
        }
        runs_.emplace(gap_begin, Run{gap_end, 0, ours.value()});
        added.push_back(gap_begin);
    }
    std::vector<uintptr_t> held;
    for (auto run = firstEndingAfter(begin); run != runs_.end() && run->first < end; ++run) {
        ++run->second.users;
        held.push_back(run->first);
    }
    return held;
}

void PinnedPages::release(const std::vector<uintptr_t>& held) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uintptr_t start : held) {
        auto run = runs_.find(start);
        if (run == runs_.end() || --run->second.users > 0)
            continue;
        if (run->second.ours)
            unregister_(start);
        runs_.erase(run);
    }
}

size_t PinnedPages::registrations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return runs_.size();
}

namespace {

Result<bool> cudaRegister(uintptr_t begin, size_t bytes, bool io) {
    void* p = reinterpret_cast<void*>(begin);
    cudaError_t err =
        cudaHostRegister(p, bytes, cudaHostRegisterMapped | (io ? cudaHostRegisterIoMemory : 0u));
    if (err != cudaSuccess && io) {
        // Not MMIO after all (a software provider's doorbell word).
        (void)cudaGetLastError();
        err = cudaHostRegister(p, bytes, cudaHostRegisterMapped);
    }
    if (err == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        return false;  // pinned by someone else: used, not ours to unpin
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return Internal(std::string("cudaHostRegister (") +
                        (io ? "the doorbell register" : "IBGDA queues") +
                        "): " + cudaGetErrorString(err));
    }
    return true;
}

}  // namespace

PinnedPages& processPinnedPages() {
    // Never destroyed: queue pairs mapped by static objects may be released
    // during exit, after a function-local static would be gone.
    static PinnedPages* pages = new PinnedPages(cudaRegister, [](uintptr_t begin) {
        (void)cudaHostUnregister(reinterpret_cast<void*>(begin));
    });
    return *pages;
}

}  // namespace mooncake::ep
