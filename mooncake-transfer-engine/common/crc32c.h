// CRC-32C (Castagnoli) used to checksum wire frames.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooncake {

// Extends `crc` (start with 0) over [data, data + len). Picks the fastest
// implementation the CPU supports on first use.
uint32_t crc32c(uint32_t crc, const void* data, size_t len);

// The implementations behind crc32c(), for tests and benchmarks; all give
// the same result.
enum class Crc32cImpl {
    kPortable,  // table driven
    kSse42,     // the crc32 instruction, one 8-byte step at a time
    kPclmul,    // 128-bit carry-less multiply folding (SSE4.2 + PCLMULQDQ)
    kAvx512,    // 512-bit folding (AVX-512 + VPCLMULQDQ)
};
bool crc32cSupported(Crc32cImpl impl);
// `impl` must be supported.
uint32_t crc32cWith(Crc32cImpl impl, uint32_t crc, const void* data, size_t len);

}  // namespace mooncake
