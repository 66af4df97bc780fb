// CRC-32C (Castagnoli) used to checksum wire frames.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooncake {

// Extends `crc` (start with 0) over [data, data + len).
uint32_t crc32c(uint32_t crc, const void* data, size_t len);

}  // namespace mooncake
