// Element-wise reduction kernels of the collectives.
//
// The kernels combine their inputs strictly left to right, so two ranks that
// reduce the same inputs in the same (rank) order get bit-identical results,
// whatever the dtype.
//
// float16 and bfloat16 are combined pairwise through float and rounded back to
// the 16-bit type after every step, which is what a chain of 16-bit additions
// would produce. bool has no arithmetic: SUM and MAX are logical or, PRODUCT
// and MIN are logical and, BAND/BOR/BXOR are and/or/xor of the truth values;
// results are 0 or 1. Integer SUM and PRODUCT wrap around like unsigned
// arithmetic of the same width. MIN and MAX of floats propagate NaN.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mooncake-pg/core/types.h"

namespace mooncake::pg {

// out[i] = in[0][i] op in[1][i] op ... op in[n-1][i] for i < count. AVG
// (floating point only) divides the sum by n. `out` may be exactly one of the
// inputs (same address), never a partial overlap. The caller has checked
// reduceOpSupported(op, dtype); n >= 1.
void reduceInto(DataType dtype, ReduceOp op, void* out, const void* const* in, int n, size_t count);

// IEEE binary16 and bfloat16 conversions (round to nearest even).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace mooncake::pg
