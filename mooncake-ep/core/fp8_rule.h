// The FP8 rule dispatch applies per token and per group of 128 channels
// (DeepEP's): amax = max |x| floored at kEpFp8AmaxFloor, the stored scale is
// amax / 448 (dequantize: x ~ fp8 * scale) and the data is
// E4M3(x * (448 / amax)), round to nearest even, saturating at +-448.
#pragma once

namespace mooncake::ep {

inline constexpr float kEpFp8Max = 448.0f;
inline constexpr float kEpFp8AmaxFloor = 1e-4f;
inline constexpr int kEpFp8GroupSize = 128;

}  // namespace mooncake::ep
