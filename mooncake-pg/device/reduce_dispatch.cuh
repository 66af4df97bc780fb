// From a runtime (dtype, op) pair to code instantiated for the element type
// and the operator. Pairs the CPU core refuses (bitwise ops on floats, AVG on
// integers) are never instantiated: callers refuse them before launching, and
// skipping them keeps the number of kernels (and the build time) down.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "mooncake-pg/core/types.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

template <typename T>
struct TypeTag {
    using type = T;
};
template <ReduceOp kOp>
using OpTag = std::integral_constant<ReduceOp, kOp>;

template <typename T>
inline constexpr bool kIsFloat =
    std::is_floating_point_v<T> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <typename T, ReduceOp kOp>
inline constexpr bool kOpDefined =
    kIsFloat<T> ? !(kOp == ReduceOp::kBand || kOp == ReduceOp::kBor || kOp == ReduceOp::kBxor)
                : kOp != ReduceOp::kAvg;

template <typename T, ReduceOp kOp, typename F>
Status visitDefined(F&& f) {
    if constexpr (kOpDefined<T, kOp>)
        return f(TypeTag<T>{}, OpTag<kOp>{});
    else
        return InvalidArgument("reduce op not defined for this dtype");
}

template <typename T, typename F>
Status visitOp(ReduceOp op, F&& f) {
    switch (op) {
        case ReduceOp::kSum:
            return visitDefined<T, ReduceOp::kSum>(f);
        case ReduceOp::kAvg:
            return visitDefined<T, ReduceOp::kAvg>(f);
        case ReduceOp::kProduct:
            return visitDefined<T, ReduceOp::kProduct>(f);
        case ReduceOp::kMin:
            return visitDefined<T, ReduceOp::kMin>(f);
        case ReduceOp::kMax:
            return visitDefined<T, ReduceOp::kMax>(f);
        case ReduceOp::kBand:
            return visitDefined<T, ReduceOp::kBand>(f);
        case ReduceOp::kBor:
            return visitDefined<T, ReduceOp::kBor>(f);
        case ReduceOp::kBxor:
            return visitDefined<T, ReduceOp::kBxor>(f);
    }
    return InvalidArgument("unknown reduce op");
}

// Calls f(TypeTag<T>{}, OpTag<op>{}) and returns its status.
template <typename F>
Status visitReduce(DataType dtype, ReduceOp op, F&& f) {
    switch (dtype) {
        case DataType::kFloat32:
            return visitOp<float>(op, f);
        case DataType::kFloat64:
            return visitOp<double>(op, f);
        case DataType::kFloat16:
            return visitOp<__half>(op, f);
        case DataType::kBFloat16:
            return visitOp<__nv_bfloat16>(op, f);
        case DataType::kInt8:
            return visitOp<int8_t>(op, f);
        case DataType::kUInt8:
            return visitOp<uint8_t>(op, f);
        case DataType::kInt16:
            return visitOp<int16_t>(op, f);
        case DataType::kInt32:
            return visitOp<int32_t>(op, f);
        case DataType::kInt64:
            return visitOp<int64_t>(op, f);
        case DataType::kBool:
            return visitOp<bool>(op, f);
    }
    return InvalidArgument("unknown dtype");
}

}  // namespace mooncake::pg::device
