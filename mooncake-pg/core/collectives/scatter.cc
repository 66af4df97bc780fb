// scatter: the root sends block p to member p, one piece per round.
#include <algorithm>
#include <cstring>

#include "mooncake-pg/core/collectives/collectives.h"

namespace mooncake::pg::coll {

Status scatter(Rounds& rounds, const void* in, void* out, size_t bytes_per_rank, int root) {
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const bool is_root = rounds.rank() == root;
    const size_t chunk = rounds.chunk();
    const size_t pieces = std::max<size_t>(1, ceilDiv(bytes_per_rank, chunk));
    for (size_t t = 0; t < pieces; ++t) {
        const Span part = pieceOf(bytes_per_rank, t, chunk);
        if (is_root && part.length != 0) {
            for (int p : rounds.members()) {
                if (p == root)
                    continue;
                MC_RETURN_IF_ERROR(
                    rounds.send(p, src + p * bytes_per_rank + part.offset, part.length));
            }
        }
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (is_root) {
            if (t == 0) {
                const uint8_t* own = src + root * bytes_per_rank;
                if (own != dst && bytes_per_rank != 0)
                    std::memmove(dst, own, bytes_per_rank);
            }
        } else {
            MC_RETURN_IF_ERROR(rounds.expectBytes(root, part.length));
            if (part.length != 0)
                std::memcpy(dst + part.offset, rounds.payload(root), part.length);
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace mooncake::pg::coll
