// Element types and reduction operators of the torch-free PG core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooncake::pg {

enum class DataType : uint8_t {
    kFloat32 = 0,
    kFloat64,
    kFloat16,
    kBFloat16,
    kInt8,
    kUInt8,
    kInt16,
    kInt32,
    kInt64,
    kBool,
};

enum class ReduceOp : uint8_t { kSum = 0, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };

size_t dataTypeSize(DataType t);
const char* dataTypeName(DataType t);
const char* reduceOpName(ReduceOp op);
bool isFloatingPoint(DataType t);

// Whether `op` is defined for `t` (bitwise ops need integers or bool; AVG needs
// floating point). `why` receives the reason when it is not.
bool reduceOpSupported(ReduceOp op, DataType t, std::string* why);

}  // namespace mooncake::pg
