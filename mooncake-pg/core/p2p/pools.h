// Fixed-size chunk allocators for the P2P send and receive pools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace mooncake::pg::p2p {

// Splits one pool region into chunk_bytes-sized chunks. Chunks are returned
// in any order (acks arrive per tag, not in allocation order), so this is a
// free list rather than a ring. Tracks ownership to catch protocol bugs that
// would release a chunk twice.
class ChunkPool {
  public:
    ChunkPool() = default;
    ChunkPool(size_t pool_bytes, size_t chunk_bytes);

    std::optional<uint32_t> allocate();
    // Returns false (and changes nothing) for a chunk that is not allocated.
    bool release(uint32_t chunk);
    // Makes every chunk free again (epoch change, broken pair).
    void reset();

    uint64_t offsetOf(uint32_t chunk) const { return uint64_t{chunk} * chunk_bytes_; }
    uint32_t chunkCount() const { return count_; }
    uint32_t freeCount() const { return static_cast<uint32_t>(free_.size()); }

  private:
    size_t chunk_bytes_ = 0;
    uint32_t count_ = 0;
    std::vector<uint32_t> free_;
    std::vector<uint8_t> in_use_;
};

}  // namespace mooncake::pg::p2p
