// Spin-then-block waiting for hand-offs between threads of one process.
//
// Waking a thread blocked on a condition variable costs a futex call on
// each side and the scheduler's wake-up latency (tens of microseconds on an
// idle machine whose cores sit in deep sleep states), far more than a small
// collective itself. A waiter that expects its event within microseconds
// therefore polls first, for at most spinBudget(), and blocks only after
// that: no core stays busy for longer than the budget when nothing happens.
//
// Knob (read once per process):
//   MC_PG_SPIN_US  how long a hand-off waiter polls before it blocks, in
//                  microseconds (default 50; 0: block at once, the choice
//                  for hosts with far more busy threads than cores).
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace mooncake::pg {

// The MC_PG_SPIN_US budget.
std::chrono::microseconds spinBudget();

// Polls `ready` until it returns true (then returns true) or `budget` has
// passed (then false). The first polls only pause the core; later ones yield
// it, so with more runnable threads than cores the thread being waited for
// gets to run.
template <typename Pred>
bool spinUntil(Pred ready, std::chrono::microseconds budget) {
    constexpr uint32_t kPausePolls = 64;
    if (ready())
        return true;
    if (budget.count() <= 0)
        return false;
    const auto until = std::chrono::steady_clock::now() + budget;
    for (uint32_t i = 1;; ++i) {
        if (ready())
            return true;
        if (i < kPausePolls) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        // Reading the clock costs about as much as a yield; doing it every
        // 16 polls keeps the overshoot small without dominating the loop.
        if ((i & 15) == 0 && std::chrono::steady_clock::now() >= until)
            return ready();
        sched_yield();
    }
}

// Paces a loop that polls for something which may take long (device work,
// the worker's completion of a call): the first polls only yield the core,
// later ones sleep briefly, so a long wait costs no busy core.
class PollPacer {
public:
    // Between two polls that found nothing.
    void pause() {
        constexpr uint32_t kYieldPolls = 256;
        constexpr auto kSleep = std::chrono::microseconds(20);
        if (++polls_ < kYieldPolls) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(kSleep);
        }
    }
    // After progress: the next wait may be short again.
    void reset() { polls_ = 0; }

private:
    uint32_t polls_ = 0;
};

}  // namespace mooncake::pg
