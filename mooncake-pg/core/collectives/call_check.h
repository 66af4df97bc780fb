// Round-0 call checks: whether every active rank made the same call.
#pragma once

#include <vector>

#include "mooncake-pg/core/collectives/rounds.h"

namespace mooncake::pg::coll {

// Compares the round-0 headers of all members (indexed by rank; this rank's
// own entry describes its own call). Every member sees the same set of
// headers, so every member reaches the same verdict: the first member, in
// rank order, whose call differs from the lowest member's is reported, with
// the first differing field, e.g.
//   "all_reduce: rank 2 passed count=5, rank 0 passed count=4".
// For all-to-all-v each receiver also checks recv_bytes against what each
// sender announced, and a digest summed over all ranks tells every rank that
// some pair disagrees.
Status checkCallHeaders(const CommState& state, const CallDesc& call,
                        const std::vector<MsgHeader>& headers);

}  // namespace mooncake::pg::coll
