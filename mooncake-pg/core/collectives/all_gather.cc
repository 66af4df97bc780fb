// all_gather: every member sends its block to every other member, one piece
// per round. `in` may be this rank's block of `out` (in-place all-gather).
#include <algorithm>
#include <cstring>

#include "mooncake-pg/core/collectives/collectives.h"

namespace mooncake::pg::coll {

Status allGather(Rounds& rounds, const void* in, void* out, size_t bytes_per_rank) {
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const size_t chunk = rounds.chunk();
    const size_t pieces = std::max<size_t>(1, ceilDiv(bytes_per_rank, chunk));
    for (size_t t = 0; t < pieces; ++t) {
        const Span part = pieceOf(bytes_per_rank, t, chunk);
        MC_RETURN_IF_ERROR(rounds.sendToAll(src + part.offset, part.length));
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (t == 0) {
            // Only now: a call that failed the round-0 check leaves `out` alone.
            uint8_t* own = dst + rounds.rank() * bytes_per_rank;
            if (own != src && bytes_per_rank != 0)
                std::memmove(own, src, bytes_per_rank);
        }
        for (int p : rounds.members()) {
            if (p == rounds.rank())
                continue;
            MC_RETURN_IF_ERROR(rounds.expectData(p, part.length));
            if (part.length != 0) {
                std::memcpy(dst + p * bytes_per_rank + part.offset, rounds.data(p), part.length);
            }
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace mooncake::pg::coll
