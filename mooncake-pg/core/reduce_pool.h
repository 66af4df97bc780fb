// ReducePool: helper threads that share one large reduction or copy with the
// thread that runs the collective.
//
// One core cannot saturate a host's memory bandwidth: a single-thread memcpy
// moves a fraction of what the memory system can, and a reduction that reads
// n inputs per output element does worse. Where the host has more cores than
// ranks, a rank may spread the element-wise work of a large collective over
// a few threads. Elements are independent (each is still reduced over the
// ranks in rank order), so the result is bit-identical whatever the split.
//
// Knob (read once per process):
//   MC_PG_REDUCE_THREADS  threads per rank for large reductions and copies,
//                         the calling thread included (1: no helpers). Unset
//                         or 0: cores / ranks on this host, at most 8.
//                         At most 64.
// CommOptions::reduce_threads overrides both for one Communicator.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "mooncake-pg/core/types.h"

namespace mooncake::pg {

class ReducePool {
public:
    // Most threads one run may use, the caller included.
    static constexpr int kMaxThreads = 64;

    // Starts `threads` - 1 helpers now; run() starts more when asked for
    // more (up to kMaxThreads), so a pool holds as many as it was ever
    // asked for, each asleep while unused.
    explicit ReducePool(int threads = 1);
    ~ReducePool();
    ReducePool(const ReducePool&) = delete;
    ReducePool& operator=(const ReducePool&) = delete;

    // Calls fn(part) once for every part in [0, parts), on the calling thread
    // and up to threads - 1 helpers, and returns when all calls have
    // returned. fn must not throw. Parts are claimed one at a time, so a
    // helper that wakes late only means the caller runs more of them. When
    // another thread is using the pool, every part runs on the caller.
    void run(int threads, size_t parts, const std::function<void(size_t)>& fn);

    // The process's pool (never stopped: a collective may still be running
    // on some thread while the process exits).
    static ReducePool& shared();

private:
    void helperLoop(int index);
    // Starts helpers until there are `helpers` (at most kMaxThreads - 1).
    // Caller holds run_mu_.
    void growLocked(int helpers);
    // Claims the next part of job `gen`; false once none is left.
    bool claim(uint64_t gen, size_t* part);

    std::mutex run_mu_;  // one run at a time; guards helpers_
    std::vector<std::thread> helpers_;

    // The current job. gen_ advances once per run; claim_ holds (job
    // generation << 32 | next part) so a helper that wakes after its job
    // ended cannot claim a part of the next one.
    std::atomic<uint64_t> gen_{0};
    std::atomic<uint64_t> claim_{0};
    std::atomic<size_t> parts_{0};
    std::atomic<int> helpers_wanted_{0};
    std::atomic<const std::function<void(size_t)>*> fn_{nullptr};
    std::atomic<size_t> finished_{0};

    std::mutex sleep_mu_;  // guards stop_; pairs with sleep_cv_
    std::condition_variable sleep_cv_;
    bool stop_ = false;
    std::atomic<bool> stopping_{false};
};

// Threads a rank uses for a large element-wise step: `configured` if > 0,
// else MC_PG_REDUCE_THREADS if set (both capped at ReducePool::kMaxThreads),
// else cores / `local_ranks` (the ranks of the group on this host), at most
// 8 and at least 1.
int reduceThreadsFor(int configured, int local_ranks);

// Steps smaller than this run on one thread: waking helpers costs more than
// they save.
constexpr size_t kParallelMinBytes = size_t{256} << 10;

// Calls fn(begin, end) over consecutive ranges that cover [0, total), each
// a multiple of `grain` units except the last, on up to `threads` threads of
// `pool` (null: one call on the caller). `unit_bytes` (the bytes a unit
// touches) sizes the parts and decides whether helpers are worth waking.
void parallelRanges(ReducePool* pool, int threads, size_t total, size_t grain, size_t unit_bytes,
                    const std::function<void(size_t, size_t)>& fn);

// reduceInto of elements [begin, end) only: out and every input advanced to
// `begin`. What each thread of a parallel reduction runs.
void reduceRange(DataType dtype, ReduceOp op, void* out, const void* const* in, int n, size_t begin,
                 size_t end);

// Element slices of a parallel reduction are multiples of this many elements
// (whole cache lines), so no two threads write one line.
inline size_t reduceGrain(DataType dtype) {
    return 64 / dataTypeSize(dtype);
}

// reduceInto (core/reduce_kernels.h) over `threads` threads of `pool` (null:
// the caller alone); same contract and bit-identical results.
void parallelReduceInto(ReducePool* pool, int threads, DataType dtype, ReduceOp op, void* out,
                        const void* const* in, int n, size_t count);

// memcpy over `threads` threads of `pool` (null: the caller alone).
void parallelCopy(ReducePool* pool, int threads, void* dst, const void* src, size_t bytes);

}  // namespace mooncake::pg
