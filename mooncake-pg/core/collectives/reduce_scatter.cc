// reduce_scatter: member p receives block p of every member's input and
// reduces it in rank order, one piece per round.
#include <algorithm>
#include <vector>

#include "mooncake-pg/core/collectives/collectives.h"
#include "mooncake-pg/core/reduce_kernels.h"

namespace mooncake::pg::coll {

Status reduceScatter(Rounds& rounds, const void* in, void* out, size_t count_per_rank,
                     DataType dtype, ReduceOp op) {
    const size_t es = dataTypeSize(dtype);
    const size_t block_bytes = count_per_rank * es;
    const auto& members = rounds.members();
    const int n = rounds.memberCount();
    const size_t piece = std::max<size_t>(1, rounds.chunk() / es);
    const size_t pieces = std::max<size_t>(1, ceilDiv(count_per_rank, piece));
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const uint8_t* own = src + rounds.rank() * block_bytes;
    std::vector<const void*>& inputs = rounds.inputs();
    for (size_t t = 0; t < pieces; ++t) {
        const Span part = pieceOf(count_per_rank, t, piece);
        if (part.length != 0) {
            for (int p : members) {
                if (p == rounds.rank())
                    continue;
                MC_RETURN_IF_ERROR(
                    rounds.send(p, src + p * block_bytes + part.offset * es, part.length * es));
            }
        }
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        for (int j = 0; j < n; ++j) {
            const int p = members[j];
            if (p == rounds.rank()) {
                inputs[j] = own + part.offset * es;
            } else {
                MC_RETURN_IF_ERROR(rounds.expectBytes(p, part.length * es));
                inputs[j] = rounds.payload(p);
            }
        }
        // `out` may be this rank's block of `in`: the kernel reads every
        // input element before writing it.
        reduceInto(dtype, op, dst + part.offset * es, inputs.data(), n, part.length);
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace mooncake::pg::coll
