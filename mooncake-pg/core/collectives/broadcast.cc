// broadcast: the root sends every piece to every member; for large messages
// among three or more members it scatters one block to each member and the
// members all-gather the blocks, so the root sends each byte about twice
// instead of n - 1 times.
#include <algorithm>
#include <cstring>

#include "mooncake-pg/core/collectives/collectives.h"

namespace mooncake::pg::coll {
namespace {

Status direct(Rounds& rounds, uint8_t* buf, size_t bytes, int root) {
    const size_t pieces = std::max<size_t>(1, ceilDiv(bytes, rounds.chunk()));
    const bool is_root = rounds.rank() == root;
    for (size_t t = 0; t < pieces; ++t) {
        const Span part = pieceOf(bytes, t, rounds.chunk());
        if (is_root)
            MC_RETURN_IF_ERROR(rounds.sendToAll(buf + part.offset, part.length));
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (!is_root) {
            MC_RETURN_IF_ERROR(rounds.expectData(root, part.length));
            if (part.length != 0)
                std::memcpy(buf + part.offset, rounds.data(root), part.length);
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

Status scatterAllGather(Rounds& rounds, uint8_t* buf, size_t bytes, int root) {
    const auto& members = rounds.members();
    const int n = rounds.memberCount();
    const int me = rounds.index();
    const bool is_root = rounds.rank() == root;
    const size_t chunk = rounds.chunk();
    const size_t pieces = std::max<size_t>(1, ceilDiv(blockOf(bytes, n, 0).length, chunk));

    // Scatter: member j gets block j from the root.
    for (size_t t = 0; t < pieces; ++t) {
        if (is_root) {
            for (int j = 0; j < n; ++j) {
                if (j == me)
                    continue;
                const Span block = blockOf(bytes, n, j);
                const Span part = pieceOf(block.length, t, chunk);
                if (part.length == 0)
                    continue;
                MC_RETURN_IF_ERROR(
                    rounds.send(members[j], buf + block.offset + part.offset, part.length));
            }
        }
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (!is_root) {
            const Span block = blockOf(bytes, n, me);
            const Span part = pieceOf(block.length, t, chunk);
            MC_RETURN_IF_ERROR(rounds.expectBytes(root, part.length));
            if (part.length != 0) {
                std::memcpy(buf + block.offset + part.offset, rounds.payload(root), part.length);
            }
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }

    // All-gather among the non-roots; the root (which has everything) sends
    // its own block and receives nothing.
    for (size_t t = 0; t < pieces; ++t) {
        const Span block = blockOf(bytes, n, me);
        const Span part = pieceOf(block.length, t, chunk);
        MC_RETURN_IF_ERROR(
            rounds.sendToAll(buf + block.offset + part.offset, part.length, is_root ? -1 : root));
        MC_RETURN_IF_ERROR(rounds.receiveAll());
        if (!is_root) {
            for (int j = 0; j < n; ++j) {
                if (j == me)
                    continue;
                const Span theirs_block = blockOf(bytes, n, j);
                const Span theirs = pieceOf(theirs_block.length, t, chunk);
                MC_RETURN_IF_ERROR(rounds.expectData(members[j], theirs.length));
                if (theirs.length != 0) {
                    std::memcpy(buf + theirs_block.offset + theirs.offset, rounds.data(members[j]),
                                theirs.length);
                }
            }
        }
        MC_RETURN_IF_ERROR(rounds.finishRound());
    }
    return Status::OK();
}

}  // namespace

Status broadcast(Rounds& rounds, void* buf, size_t bytes, int root) {
    auto* data = static_cast<uint8_t*>(buf);
    if (rounds.memberCount() >= 3 && bytes > rounds.oneShotMax()) {
        return scatterAllGather(rounds, data, bytes, root);
    }
    return direct(rounds, data, bytes, root);
}

}  // namespace mooncake::pg::coll
