// The collective algorithms, one per file, each a sequence of Rounds.
// Arguments have been checked by the Communicator (sizes, roots, supported
// reductions); `rounds` carries the call description for round 0.
#pragma once

#include <cstddef>
#include <vector>

#include "mooncake-pg/core/collectives/rounds.h"
#include "mooncake-pg/core/types.h"

namespace mooncake::pg::coll {

// [offset, offset + length) of piece `t` when `total` is cut into pieces of
// `piece`; empty past the end.
struct Span {
    size_t offset = 0;
    size_t length = 0;
};
inline Span pieceOf(size_t total, size_t t, size_t piece) {
    const size_t begin = t * piece;
    if (begin >= total)
        return {total, 0};
    return {begin, total - begin < piece ? total - begin : piece};
}
// Block `j` of `total` items split as evenly as possible into `n` blocks
// (the first total % n blocks get one more).
inline Span blockOf(size_t total, int n, int j) {
    const size_t base = total / n;
    const size_t extra = total % n;
    const size_t uj = static_cast<size_t>(j);
    return {uj * base + (uj < extra ? uj : extra), base + (uj < extra ? 1 : 0)};
}
inline size_t ceilDiv(size_t a, size_t b) {
    return (a + b - 1) / b;
}

Status allReduce(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype,
                 ReduceOp op);
Status broadcast(Rounds& rounds, void* buf, size_t bytes, int root);
Status reduce(Rounds& rounds, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
              int root);
Status allGather(Rounds& rounds, const void* in, void* out, size_t bytes_per_rank);
Status reduceScatter(Rounds& rounds, const void* in, void* out, size_t count_per_rank,
                     DataType dtype, ReduceOp op);
Status allToAllV(Rounds& rounds, const void* in, const std::vector<size_t>& send_bytes,
                 const std::vector<size_t>& send_offsets, void* out,
                 const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets);
Status gather(Rounds& rounds, const void* in, void* out, size_t bytes_per_rank, int root);
Status scatter(Rounds& rounds, const void* in, void* out, size_t bytes_per_rank, int root);
Status barrier(Rounds& rounds);

}  // namespace mooncake::pg::coll
