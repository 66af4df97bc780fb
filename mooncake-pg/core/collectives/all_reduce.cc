// all_reduce: one-shot for small messages, reduce-scatter + all-gather in
// chunked rounds for large ones. Both reduce every element over all members
// in rank order, so every rank ends with the same bits whichever path runs.
#include <algorithm>
#include <cstring>
#include <vector>

#include "mooncake-pg/core/collectives/collectives.h"
#include "mooncake-pg/core/reduce_kernels.h"
#include "mooncake-pg/core/reduce_pool.h"

namespace mooncake::pg::coll {
namespace {

// Pieces of the chunked path stay at most this large even with bigger
// slots, so a piece is reduced and read back by the peers while it is still
// in cache: with 4 ranks on 2 cores, 64 MiB all_reduce measured ~20% faster
// than with 4 MiB pieces (2 ranks: no difference); smaller pieces lose more
// to the extra rounds than they gain.
constexpr size_t kMaxPieceBytes = size_t{1} << 20;

// One round: everyone sends its whole input to everyone and reduces all of
// them locally, which beats two rounds of smaller messages while the
// latency of a round dominates.
Status oneShot(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype,
               ReduceOp op) {
    const size_t bytes = count * dataTypeSize(dtype);
    const auto& members = rounds.members();
    MC_RETURN_IF_ERROR(rounds.sendToAll(in, bytes));
    MC_RETURN_IF_ERROR(rounds.receiveAll());
    std::vector<const void*>& inputs = rounds.inputs();
    for (size_t j = 0; j < members.size(); ++j) {
        const int p = members[j];
        if (p == rounds.rank()) {
            inputs[j] = in;
        } else {
            MC_RETURN_IF_ERROR(rounds.expectData(p, bytes));
            inputs[j] = rounds.data(p);
        }
    }
    reduceInto(dtype, op, out, inputs.data(), static_cast<int>(inputs.size()), count);
    return rounds.finishRound();
}

// Member j reduces block j of the elements (reduce-scatter), then every
// member sends its reduced block to all (all-gather). Each phase moves
// (n-1)/n of the data per rank, cut into pieces of at most one slot.
//
// When every member maps every window (one host), the all-gather rides along
// with the reduce-scatter: the piece reduced in round t is published in the
// reducer's own window and read in place by everyone in round t + 1. That
// saves the (n-1) per-peer copies of each reduced piece and reads it while
// it is still in cache, in pieces + 1 rounds instead of 2 * pieces.
Status reduceScatterAllGather(Rounds& rounds, const void* in, void* out, size_t count,
                              DataType dtype, ReduceOp op) {
    const size_t es = dataTypeSize(dtype);
    const auto& members = rounds.members();
    const int n = rounds.memberCount();
    const int me = rounds.index();
    const size_t piece = std::max<size_t>(1, std::min(rounds.chunk(), kMaxPieceBytes) / es);
    const size_t pieces = std::max<size_t>(1, ceilDiv(blockOf(count, n, 0).length, piece));
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    const Span mine = blockOf(count, n, me);
    std::vector<const void*>& inputs = rounds.inputs();
    // Known after round 0, which is the same either way.
    bool fused = false;
    // The element-wise work of a round (reduce, publish, copy back) may
    // spread over more threads where the host has cores to spare.
    const int threads = rounds.stepThreads();
    ReducePool* pool = threads > 1 ? &ReducePool::shared() : nullptr;

    for (size_t t = 0; t < pieces + (fused ? 1 : 0); ++t) {
        // Published now: what this rank reduced last round.
        const Span done = fused && t > 0 ? pieceOf(mine.length, t - 1, piece) : Span{};
        for (int j = 0; j < n; ++j) {
            if (j == me)
                continue;
            const Span block = blockOf(count, n, j);
            const Span part = pieceOf(block.length, t, piece);
            if (part.length == 0 && done.length == 0)
                continue;
            MC_RETURN_IF_ERROR(rounds.send(members[j], src + (block.offset + part.offset) * es,
                                           part.length * es, nullptr, 0, done.length * es));
        }
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (t == 0)
            fused = rounds.everyoneReadsInPlace();

        const Span part = pieceOf(mine.length, t, piece);
        const size_t at = (mine.offset + part.offset) * es;
        for (int j = 0; j < n; ++j) {
            if (j == me) {
                inputs[j] = src + at;
                continue;
            }
            const Span theirs =
                fused && t > 0 ? pieceOf(blockOf(count, n, j).length, t - 1, piece) : Span{};
            MC_RETURN_IF_ERROR(
                rounds.expectBytes(members[j], part.length * es, theirs.length * es));
            inputs[j] = rounds.payload(members[j]);
        }
        if (part.length != 0) {
            // `out` may be `in`: only this rank reads its own block of `in`,
            // and the kernel reads each element of every input before
            // writing it.
            uint8_t* publish = fused ? rounds.nextPublishArea() : nullptr;
            const void* const* ins = inputs.data();
            // Each slice is published right after it is reduced, while it
            // is still in cache.
            parallelRanges(pool, threads, part.length, reduceGrain(dtype),
                           es * static_cast<size_t>(n + 2), [&](size_t b, size_t e) {
                               reduceRange(dtype, op, dst + at, ins, n, b, e);
                               if (publish != nullptr)
                                   std::memcpy(publish + b * es, dst + at + b * es, (e - b) * es);
                           });
        }
        if (fused && t > 0) {
            for (int j = 0; j < n; ++j) {
                if (j == me)
                    continue;
                const Span block = blockOf(count, n, j);
                const Span theirs = pieceOf(block.length, t - 1, piece);
                if (theirs.length != 0) {
                    parallelCopy(pool, threads, dst + (block.offset + theirs.offset) * es,
                                 rounds.published(members[j]), theirs.length * es);
                }
            }
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    if (fused)
        return Status::OK();

    for (size_t t = 0; t < pieces; ++t) {
        const Span part = pieceOf(mine.length, t, piece);
        MC_RETURN_IF_ERROR(
            rounds.sendToAll(dst + (mine.offset + part.offset) * es, part.length * es));
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        for (int j = 0; j < n; ++j) {
            if (j == me)
                continue;
            const Span block = blockOf(count, n, j);
            const Span theirs = pieceOf(block.length, t, piece);
            MC_RETURN_IF_ERROR(rounds.expectData(members[j], theirs.length * es));
            if (theirs.length != 0) {
                parallelCopy(pool, threads, dst + (block.offset + theirs.offset) * es,
                             rounds.data(members[j]), theirs.length * es);
            }
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace

Status allReduce(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype,
                 ReduceOp op) {
    const size_t bytes = count * dataTypeSize(dtype);
    if (rounds.memberCount() == 1 || bytes <= std::min(rounds.oneShotMax(), rounds.chunk())) {
        return oneShot(rounds, in, out, count, dtype, op);
    }
    return reduceScatterAllGather(rounds, in, out, count, dtype, op);
}

}  // namespace mooncake::pg::coll
