#include "mooncake-pg/core/p2p/pools.h"

namespace mooncake::pg::p2p {

ChunkPool::ChunkPool(size_t pool_bytes, size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
    count_ = chunk_bytes == 0 ? 0 : static_cast<uint32_t>(pool_bytes / chunk_bytes);
    in_use_.assign(count_, 0);
    reset();
}

std::optional<uint32_t> ChunkPool::allocate() {
    if (free_.empty())
        return std::nullopt;
    uint32_t chunk = free_.back();
    free_.pop_back();
    in_use_[chunk] = 1;
    return chunk;
}

bool ChunkPool::release(uint32_t chunk) {
    if (chunk >= count_ || !in_use_[chunk])
        return false;
    in_use_[chunk] = 0;
    free_.push_back(chunk);
    return true;
}

void ChunkPool::reset() {
    free_.clear();
    // Lowest offsets first: keeps a lightly used pool's footprint small.
    for (uint32_t c = count_; c > 0; --c)
        free_.push_back(c - 1);
    in_use_.assign(count_, 0);
}

}  // namespace mooncake::pg::p2p
