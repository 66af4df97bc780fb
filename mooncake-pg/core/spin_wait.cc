#include "mooncake-pg/core/spin_wait.h"

#include <algorithm>

#include "mooncake-transfer-engine/common/env.h"

namespace mooncake::pg {
namespace {

MC_ENV_INT(SpinUs, "MC_PG_SPIN_US", 50)

}  // namespace

std::chrono::microseconds spinBudget() {
    // Negative values mean "do not spin"; the cap keeps a typo from turning
    // every idle waiter into a busy loop.
    static const std::chrono::microseconds budget(std::clamp<int64_t>(envSpinUs(), 0, 10000));
    return budget;
}

}  // namespace mooncake::pg
