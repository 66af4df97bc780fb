// reduce: one-shot to the root for small messages; for large ones a
// reduce-scatter whose reduced pieces are forwarded to the root one round
// later, so the root neither receives (n-1) full copies nor does all the
// arithmetic. Elements are reduced in rank order, like all_reduce.
//
// Non-root ranks never write `out`: a reduced piece waits for its round in
// the rank's publish area (see rounds.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "mooncake-pg/core/collectives/collectives.h"
#include "mooncake-pg/core/reduce_kernels.h"

namespace mooncake::pg::coll {
namespace {

Status oneShot(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
               int root) {
    const size_t bytes = count * dataTypeSize(dtype);
    const bool is_root = rounds.rank() == root;
    if (!is_root && bytes != 0)
        MC_RETURN_IF_ERROR(rounds.send(root, in, bytes));
    MC_RETURN_IF_ERROR(rounds.receiveAll());
    if (is_root) {
        const auto& members = rounds.members();
        std::vector<const void*>& inputs = rounds.inputs();
        for (size_t j = 0; j < members.size(); ++j) {
            const int p = members[j];
            if (p == root) {
                inputs[j] = in;
            } else {
                MC_RETURN_IF_ERROR(rounds.expectBytes(p, bytes));
                inputs[j] = rounds.payload(p);
            }
        }
        reduceInto(dtype, op, out, inputs.data(), static_cast<int>(inputs.size()), count);
    }
    return rounds.finishRound();
}

// Round t carries piece t of the reduce-scatter and, to the root, the piece
// each member reduced in round t - 1. Both share one slot, so pieces are
// half a slot.
Status pipelined(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype,
                 ReduceOp op, int root) {
    const size_t es = dataTypeSize(dtype);
    const auto& members = rounds.members();
    const int n = rounds.memberCount();
    const int me = rounds.index();
    const bool is_root = rounds.rank() == root;
    const size_t piece = std::max<size_t>(1, rounds.chunk() / 2 / es);
    const size_t pieces = std::max<size_t>(1, ceilDiv(blockOf(count, n, 0).length, piece));
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const Span mine = blockOf(count, n, me);
    std::vector<const void*>& inputs = rounds.inputs();

    for (size_t t = 0; t <= pieces; ++t) {
        // What this rank reduced last round, on its way to the root.
        Span forward;
        if (!is_root && t > 0)
            forward = pieceOf(mine.length, t - 1, piece);
        // Reduced last round into what is now this round's publish area: a
        // root that maps this window reads it there, others get a copy.
        const uint8_t* forwarded = rounds.publishArea();
        for (int j = 0; j < n; ++j) {
            if (j == me)
                continue;
            const Span block = blockOf(count, n, j);
            const Span part = pieceOf(block.length, t, piece);
            const uint8_t* a = src + (block.offset + part.offset) * es;
            const size_t fwd = members[j] == root ? forward.length * es : 0;
            if (part.length == 0 && fwd == 0)
                continue;
            if (fwd != 0 && rounds.readsInPlace(root)) {
                MC_RETURN_IF_ERROR(rounds.send(members[j], a, part.length * es, nullptr, 0, fwd));
            } else {
                MC_RETURN_IF_ERROR(rounds.send(members[j], a, part.length * es, forwarded, fwd));
            }
        }
        MC_RETURN_IF_ERROR(rounds.receiveAll());

        const Span part = pieceOf(mine.length, t, piece);
        if (is_root) {
            for (int j = 0; j < n; ++j) {
                if (j == me)
                    continue;
                const Span block = blockOf(count, n, j);
                const Span done = t > 0 ? pieceOf(block.length, t - 1, piece) : Span{};
                const int p = members[j];
                const bool in_place = rounds.publishedBytes(p) != 0;
                MC_RETURN_IF_ERROR(in_place
                                       ? rounds.expectBytes(p, part.length * es, done.length * es)
                                       : rounds.expectBytes(p, (part.length + done.length) * es));
                if (done.length != 0) {
                    const uint8_t* from =
                        in_place ? rounds.published(p) : rounds.payload(p) + part.length * es;
                    std::memcpy(dst + (block.offset + done.offset) * es, from, done.length * es);
                }
            }
        } else {
            for (int j = 0; j < n; ++j) {
                if (j != me)
                    MC_RETURN_IF_ERROR(rounds.expectBytes(members[j], part.length * es));
            }
        }
        if (part.length != 0) {
            for (int j = 0; j < n; ++j) {
                inputs[j] = j == me ? src + (mine.offset + part.offset) * es
                                    : static_cast<const void*>(rounds.payload(members[j]));
            }
            uint8_t* target =
                is_root ? dst + (mine.offset + part.offset) * es : rounds.nextPublishArea();
            reduceInto(dtype, op, target, inputs.data(), n, part.length);
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace

Status reduce(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
              int root) {
    const size_t bytes = count * dataTypeSize(dtype);
    if (rounds.memberCount() == 1 || bytes <= std::min(rounds.oneShotMax(), rounds.chunk())) {
        return oneShot(rounds, in, out, count, dtype, op, root);
    }
    return pipelined(rounds, in, out, count, dtype, op, root);
}

}  // namespace mooncake::pg::coll
