// The host reference for device reductions: inputs chosen so every dtype
// represents every partial result exactly (small integers, products of ones
// and twos), so the expected value is plain integer arithmetic, rounded once
// for AVG as the device does. Shared by every reducing collective's test.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mooncake-pg/core/types.h"

namespace mooncake::pg::device::test {

inline int64_t inputValue(ReduceOp op, int rank, size_t i) {
    switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
            return (rank + 1) * static_cast<int64_t>(i % 5 + 1);
        case ReduceOp::kProduct:
            return 1 + static_cast<int64_t>((rank + i) % 2);
        case ReduceOp::kMin:
        case ReduceOp::kMax:
            return static_cast<int64_t>((rank * 3 + i) % 11);
        default:
            return static_cast<int64_t>(((rank + 1) * 37 + i) & 0x7f);
    }
}

inline int64_t expectedValue(ReduceOp op, int size, size_t i) {
    int64_t acc = inputValue(op, 0, i);
    for (int r = 1; r < size; ++r) {
        int64_t v = inputValue(op, r, i);
        switch (op) {
            case ReduceOp::kSum:
            case ReduceOp::kAvg:
                acc += v;
                break;
            case ReduceOp::kProduct:
                acc *= v;
                break;
            case ReduceOp::kMin:
                acc = std::min(acc, v);
                break;
            case ReduceOp::kMax:
                acc = std::max(acc, v);
                break;
            case ReduceOp::kBand:
                acc &= v;
                break;
            case ReduceOp::kBor:
                acc |= v;
                break;
            case ReduceOp::kBxor:
                acc ^= v;
                break;
        }
    }
    return acc;
}

template <typename T>
T fromInt(int64_t v) {
    if constexpr (std::is_same_v<T, __half>)
        return __float2half_rn(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(static_cast<float>(v));
    else if constexpr (std::is_same_v<T, bool>)
        return v != 0;
    else
        return static_cast<T>(v);
}

// AVG of exact integer sums, rounded once to T as the device does.
template <typename T>
T averageOf(int64_t sum, int n) {
    if constexpr (std::is_same_v<T, double>)
        return static_cast<double>(sum) / n;
    float avg = static_cast<float>(sum) / static_cast<float>(n);
    if constexpr (std::is_same_v<T, __half>)
        return __float2half_rn(avg);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>)
        return __float2bfloat16_rn(avg);
    else
        return static_cast<T>(avg);
}

template <typename T>
bool sameBits(const T& a, const T& b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Rank `rank`'s element i for a reduction with op.
template <typename T>
T inputElement(ReduceOp op, int rank, size_t i) {
    const int64_t v = inputValue(op, rank, i);
    return std::is_same_v<T, bool> ? fromInt<T>(v % 2) : fromInt<T>(v);
}

// Element i of the reduction of `size` ranks' inputElement with op.
template <typename T>
T expectedElement(ReduceOp op, int size, size_t i) {
    if constexpr (std::is_same_v<T, bool>) {
        bool acc = inputValue(op, 0, i) % 2;
        for (int s = 1; s < size; ++s) {
            bool v = inputValue(op, s, i) % 2;
            if (op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kBor)
                acc = acc || v;
            else if (op == ReduceOp::kBxor)
                acc = acc != v;
            else
                acc = acc && v;
        }
        return acc;
    } else {
        if (op == ReduceOp::kAvg)
            return averageOf<T>(expectedValue(op, size, i), size);
        return fromInt<T>(expectedValue(op, size, i));
    }
}

// The first i below count where out[i] is not element first + i of the
// reduction of `size` ranks' inputElement with op; count when all match.
template <typename T>
size_t firstWrongElement(const T* out, ReduceOp op, int size, size_t first, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        if (!sameBits(out[i], expectedElement<T>(op, size, first + i)))
            return i;
    }
    return count;
}

inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                                       ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kBand,
                                       ReduceOp::kBor, ReduceOp::kBxor};

template <typename T>
struct Dtype {
    using type = T;
};

// fn(Dtype<T>{}, dtype) for every dtype, stopping at the first nonzero.
template <typename F>
int forEachDtype(F&& fn) {
    int rc = fn(Dtype<float>{}, DataType::kFloat32);
    if (!rc)
        rc = fn(Dtype<double>{}, DataType::kFloat64);
    if (!rc)
        rc = fn(Dtype<__half>{}, DataType::kFloat16);
    if (!rc)
        rc = fn(Dtype<__nv_bfloat16>{}, DataType::kBFloat16);
    if (!rc)
        rc = fn(Dtype<int8_t>{}, DataType::kInt8);
    if (!rc)
        rc = fn(Dtype<uint8_t>{}, DataType::kUInt8);
    if (!rc)
        rc = fn(Dtype<int16_t>{}, DataType::kInt16);
    if (!rc)
        rc = fn(Dtype<int32_t>{}, DataType::kInt32);
    if (!rc)
        rc = fn(Dtype<int64_t>{}, DataType::kInt64);
    if (!rc)
        rc = fn(Dtype<bool>{}, DataType::kBool);
    return rc;
}

}  // namespace mooncake::pg::device::test
