#include "mooncake-pg/core/pair_epoch.h"

#include <algorithm>

namespace mooncake::pg {

std::vector<uint64_t> pairEpochs(uint32_t self, const std::vector<uint64_t>& active_since,
                                 size_t slots) {
    auto since = [&](size_t r) { return r < active_since.size() ? active_since[r] : 0; };
    std::vector<uint64_t> out(slots, 0);
    for (size_t r = 0; r < slots; ++r)
        out[r] = std::max(since(self), since(r));
    return out;
}

}  // namespace mooncake::pg
