// The P2P pair epoch: which membership changes restart a pair's rings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mooncake::pg {

// The pair epochs rank `self` passes to P2PEngine::setMembership, from each
// slot's active_since (the epoch it was last activated in, 0 when not
// Active): the later activation of the pair's two ranks. Both ranks of a
// pair compute the same value from any view that carries the same two
// activations, whichever views in between they skipped, so a pair restarts
// exactly when one of its ranks was (re)activated. Entries past
// active_since.size() (and `self` out of range) count as never activated.
std::vector<uint64_t> pairEpochs(uint32_t self, const std::vector<uint64_t>& active_since,
                                 size_t slots);

}  // namespace mooncake::pg
