#include "mooncake-pg/core/reduce_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "mooncake-pg/core/reduce_kernels.h"
#include "mooncake-pg/core/spin_wait.h"
#include "mooncake-transfer-engine/common/env.h"

namespace mooncake::pg {
namespace {

MC_ENV_INT(ReduceThreads, "MC_PG_REDUCE_THREADS", 0)

constexpr int kDefaultThreadsCap = 8;
// A part is at least this many bytes of work: below it, claiming parts
// costs more than balancing gains.
constexpr size_t kMinPartBytes = size_t{64} << 10;
// Parts per thread: enough that a helper that wakes late is made up for by
// the others, few enough that claiming stays cheap.
constexpr size_t kPartsPerThread = 4;

int usableCores() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

ReducePool::ReducePool(int threads) {
    std::lock_guard<std::mutex> lock(run_mu_);
    growLocked(threads - 1);
}

void ReducePool::growLocked(int helpers) {
    helpers = std::min(helpers, kMaxThreads - 1);
    while (static_cast<int>(helpers_.size()) < helpers) {
        const int index = static_cast<int>(helpers_.size());
        helpers_.emplace_back([this, index] { helperLoop(index); });
    }
}

ReducePool::~ReducePool() {
    {
        std::lock_guard<std::mutex> lock(sleep_mu_);
        stop_ = true;
        stopping_.store(true, std::memory_order_release);
    }
    sleep_cv_.notify_all();
    for (auto& t : helpers_)
        t.join();
}

bool ReducePool::claim(uint64_t gen, size_t* part) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    while (true) {
        if ((c >> 32) != (gen & 0xFFFFFFFFu))
            return false;
        const size_t next = static_cast<size_t>(c & 0xFFFFFFFFu);
        if (next >= parts_.load(std::memory_order_acquire))
            return false;
        if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
            *part = next;
            return true;
        }
    }
}

void ReducePool::helperLoop(int index) {
    uint64_t seen = 0;
    while (true) {
        auto fresh = [&] {
            return gen_.load(std::memory_order_acquire) != seen ||
                   stopping_.load(std::memory_order_acquire);
        };
        // Rounds of a large collective come back to back: poll briefly
        // before sleeping, like every hand-off (core/spin_wait.h).
        if (!spinUntil(fresh, spinBudget())) {
            std::unique_lock<std::mutex> lock(sleep_mu_);
            sleep_cv_.wait(lock, [&] { return stop_ || gen_.load() != seen; });
        }
        if (stopping_.load(std::memory_order_acquire))
            return;
        seen = gen_.load(std::memory_order_acquire);
        if (index >= helpers_wanted_.load(std::memory_order_acquire))
            continue;
        size_t part = 0;
        while (claim(seen, &part)) {
            // Valid while a claimed part of this job is unfinished: run()
            // returns only after every part has.
            (*fn_.load(std::memory_order_acquire))(part);
            finished_.fetch_add(1, std::memory_order_acq_rel);
        }
    }
}

void ReducePool::run(int threads, size_t parts, const std::function<void(size_t)>& fn) {
    std::unique_lock<std::mutex> busy(run_mu_, std::defer_lock);
    // owns_lock() below tells whether try_lock got it.
    if (threads > 1 && parts > 1 && parts <= 0xFFFFFFFFu)
        (void)busy.try_lock();
    if (!busy.owns_lock()) {
        for (size_t p = 0; p < parts; ++p)
            fn(p);
        return;
    }
    growLocked(threads - 1);
    const int helpers = std::min(threads - 1, static_cast<int>(helpers_.size()));
    const uint64_t gen = gen_.load(std::memory_order_relaxed) + 1;
    fn_.store(&fn, std::memory_order_relaxed);
    parts_.store(parts, std::memory_order_relaxed);
    finished_.store(0, std::memory_order_relaxed);
    helpers_wanted_.store(helpers, std::memory_order_relaxed);
    claim_.store((gen & 0xFFFFFFFFu) << 32, std::memory_order_release);
    {
        // Under sleep_mu_, so a helper between its check and its sleep
        // cannot miss the new generation.
        std::lock_guard<std::mutex> lock(sleep_mu_);
        gen_.store(gen, std::memory_order_release);
    }
    sleep_cv_.notify_all();
    size_t part = 0;
    size_t mine = 0;
    while (claim(gen, &part)) {
        fn(part);
        ++mine;
    }
    // What is left is being run by helpers right now: a bounded wait.
    while (finished_.load(std::memory_order_acquire) + mine < parts)
        sched_yield();
}

ReducePool& ReducePool::shared() {
    static ReducePool* pool = new ReducePool();
    return *pool;
}

int reduceThreadsFor(int configured, int local_ranks) {
    if (configured > 0)
        return std::min(configured, ReducePool::kMaxThreads);
    static const int64_t knob = envReduceThreads();
    if (knob > 0)
        return static_cast<int>(std::min<int64_t>(knob, ReducePool::kMaxThreads));
    static const int cores = usableCores();
    return std::clamp(cores / std::max(1, local_ranks), 1, kDefaultThreadsCap);
}

void parallelRanges(ReducePool* pool, int threads, size_t total, size_t grain, size_t unit_bytes,
                    const std::function<void(size_t, size_t)>& fn) {
    if (total == 0)
        return;
    grain = std::max<size_t>(1, grain);
    const size_t bytes = total * std::max<size_t>(1, unit_bytes);
    if (pool == nullptr || threads <= 1 || bytes < kParallelMinBytes) {
        fn(0, total);
        return;
    }
    const size_t grains = (total + grain - 1) / grain;
    size_t parts = std::min(bytes / kMinPartBytes, kPartsPerThread * static_cast<size_t>(threads));
    parts = std::clamp<size_t>(parts, 1, grains);
    const size_t per = (grains + parts - 1) / parts * grain;
    parts = (total + per - 1) / per;
    pool->run(threads, parts, [&](size_t p) {
        const size_t begin = p * per;
        fn(begin, std::min(total, begin + per));
    });
}

void reduceRange(DataType dtype, ReduceOp op, void* out, const void* const* in, int n, size_t begin,
                 size_t end) {
    if (end <= begin || n < 1)
        return;
    const size_t es = dataTypeSize(dtype);
    constexpr int kOnStack = 64;
    const void* local[kOnStack];
    std::vector<const void*> spill;
    const void** ptrs = local;
    if (n > kOnStack) {
        spill.resize(static_cast<size_t>(n));
        ptrs = spill.data();
    }
    for (int k = 0; k < n; ++k)
        ptrs[k] = static_cast<const uint8_t*>(in[k]) + begin * es;
    reduceInto(dtype, op, static_cast<uint8_t*>(out) + begin * es, ptrs, n, end - begin);
}

void parallelReduceInto(ReducePool* pool, int threads, DataType dtype, ReduceOp op, void* out,
                        const void* const* in, int n, size_t count) {
    // A thread touches n inputs and the output per element.
    const size_t unit = dataTypeSize(dtype) * static_cast<size_t>(std::max(n, 0) + 1);
    parallelRanges(pool, threads, count, reduceGrain(dtype), unit, [&](size_t begin, size_t end) {
        reduceRange(dtype, op, out, in, n, begin, end);
    });
}

void parallelCopy(ReducePool* pool, int threads, void* dst, const void* src, size_t bytes) {
    parallelRanges(pool, threads, bytes, 64, 2, [&](size_t begin, size_t end) {
        std::memcpy(static_cast<uint8_t*>(dst) + begin, static_cast<const uint8_t*>(src) + begin,
                    end - begin);
    });
}

}  // namespace mooncake::pg
