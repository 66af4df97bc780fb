// Host pages that IBGDA queue pairs share, pinned and mapped into the GPU once
// for all of them. A provider packs small objects into shared pages (mlx5
// keeps several queue pairs' doorbell records in one page; a software
// provider's queues sit side by side on the heap), so two queue pairs' spans
// can overlap. CUDA registers a range only where no page of it is registered
// yet and unregisters only whole registrations: registering the second span
// whole fails, and skipping it left its other pages unmapped
// (cudaHostGetDevicePointer: invalid argument). PinnedPages registers the
// pages of a span that no registration covers yet, as new registrations,
// and counts the spans using each registration, unregistering it when the
// last one goes. The CUDA calls are injected, so the bookkeeping is tested
// without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

class PinnedPages {
public:
    // Registers [begin, begin + bytes) (whole pages, I/O memory when `io`):
    // true when registered now, false when the range was registered
    // already by someone else (used as it is, never unregistered here).
    using Register = std::function<Result<bool>(uintptr_t begin, size_t bytes, bool io)>;
    using Unregister = std::function<void(uintptr_t begin)>;

    PinnedPages(Register reg, Unregister unreg);
    PinnedPages(const PinnedPages&) = delete;
    PinnedPages& operator=(const PinnedPages&) = delete;

    // Pins the pages of [begin, end) (page-aligned, end > begin) for one more
    // user; returns the starts of the registrations it now holds, to give
    // back with release(). Nothing is held when it fails.
    Result<std::vector<uintptr_t>> acquire(uintptr_t begin, uintptr_t end, bool io);
    void release(const std::vector<uintptr_t>& held);

    // How many registrations are held, for tests.
    size_t registrations() const;

private:
    struct Run {
        uintptr_t end;
        int users;
        bool ours;  // registered here, so unregistered here
    };

    // The first registration that ends past `addr` (the one holding it, or
    // the next); runs_.end() if none. Called with mu_ held.
    std::map<uintptr_t, Run>::iterator firstEndingAfter(uintptr_t addr);

    const Register register_;
    const Unregister unregister_;
    mutable std::mutex mu_;
    std::map<uintptr_t, Run> runs_;  // by start; they never overlap
};

// The process's pages, pinned with cudaHostRegister (mapped; I/O memory for
// the doorbell register, plain where that fails: a software provider's
// doorbell word).
PinnedPages& processPinnedPages();

}  // namespace mooncake::ep
