// all_to_all_v: every pair exchanges its own byte count, one piece per
// round. The number of rounds follows from the largest count any rank
// announced in round 0, so every rank runs the same number.
#include <algorithm>
#include <cstring>

#include "mooncake-pg/core/collectives/collectives.h"

namespace mooncake::pg::coll {

Status allToAllV(Rounds& rounds, const void* in, const std::vector<size_t>& send_bytes,
                 const std::vector<size_t>& send_offsets, void* out,
                 const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets) {
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const int me = rounds.rank();
    const size_t chunk = rounds.chunk();
    size_t pieces = 1;  // known after round 0
    for (size_t t = 0; t < pieces; ++t) {
        for (int p : rounds.members()) {
            if (p == me)
                continue;
            const Span part = pieceOf(send_bytes[p], t, chunk);
            if (part.length == 0)
                continue;
            MC_RETURN_IF_ERROR(rounds.send(p, src + send_offsets[p] + part.offset, part.length));
        }
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (t == 0) {
            pieces = std::max<size_t>(1, ceilDiv(rounds.maxAnnouncedBytes(), chunk));
            if (send_bytes[me] != 0) {
                std::memmove(dst + recv_offsets[me], src + send_offsets[me], send_bytes[me]);
            }
        }
        for (int p : rounds.members()) {
            if (p == me)
                continue;
            const Span part = pieceOf(recv_bytes[p], t, chunk);
            MC_RETURN_IF_ERROR(rounds.expectBytes(p, part.length));
            if (part.length != 0) {
                std::memcpy(dst + recv_offsets[p] + part.offset, rounds.payload(p), part.length);
            }
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace mooncake::pg::coll
