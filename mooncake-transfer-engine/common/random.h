#pragma once

#include <string>

namespace mooncake {

// `bytes` bytes from the kernel's CSPRNG, hex encoded (2 * bytes characters).
std::string randomHex(size_t bytes);

// Compares in time independent of where the strings differ.
bool constantTimeEquals(const std::string& a, const std::string& b);

}  // namespace mooncake
