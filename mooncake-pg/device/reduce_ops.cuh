// Element-wise reduction on the device with the CPU core's semantics
// (core/reduce_kernels.h), so a CUDA collective and a CPU one over the same
// inputs agree bit for bit: inputs are combined in rank order, float16 and
// bfloat16 through float with a rounding back after every step, integer SUM
// and PRODUCT wrap, MIN/MAX of floats propagate NaN, bool is logical.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "mooncake-pg/core/types.h"

namespace mooncake::pg::device {

// How an element is loaded into the type the operators work on and stored back.
template <typename T>
struct Elem {
    using Acc = T;
    __device__ static Acc load(T v) { return v; }
    __device__ static T store(Acc v) { return v; }
};
template <>
struct Elem<__half> {
    using Acc = float;
    __device__ static Acc load(__half v) { return __half2float(v); }
    __device__ static __half store(Acc v) { return __float2half_rn(v); }
};
template <>
struct Elem<__nv_bfloat16> {
    using Acc = float;
    __device__ static Acc load(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat16 store(Acc v) { return __float2bfloat16_rn(v); }
};

template <typename A>
__device__ __forceinline__ A minOf(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
        if (a != a || b != b)
            return a != a ? a : b;
    }
    return b < a ? b : a;
}
template <typename A>
__device__ __forceinline__ A maxOf(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
        if (a != a || b != b)
            return a != a ? a : b;
    }
    return a < b ? b : a;
}

// One step a op b in the accumulator type, rounded back to T.
template <typename T, ReduceOp kOp>
__device__ __forceinline__ T combine(T a_stored, T b_stored) {
    using E = Elem<T>;
    using A = typename E::Acc;
    if constexpr (std::is_same_v<T, bool>) {
        if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kMax || kOp == ReduceOp::kBor)
            return a_stored || b_stored;
        if constexpr (kOp == ReduceOp::kBxor)
            return a_stored != b_stored;
        return a_stored && b_stored;  // PRODUCT, MIN, BAND
    } else {
        A a = E::load(a_stored), b = E::load(b_stored);
        if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
            if constexpr (std::is_integral_v<A>) {
                using U = std::make_unsigned_t<A>;
                return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
            } else {
                return E::store(a + b);
            }
        } else if constexpr (kOp == ReduceOp::kProduct) {
            if constexpr (std::is_integral_v<A>) {
                using U = std::make_unsigned_t<A>;
                // Promote so that 16-bit unsigned products cannot overflow int.
                using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
                return static_cast<T>(static_cast<U>(static_cast<W>(a) * static_cast<W>(b)));
            } else {
                return E::store(a * b);
            }
        } else if constexpr (kOp == ReduceOp::kMin) {
            return E::store(minOf(a, b));
        } else if constexpr (kOp == ReduceOp::kMax) {
            return E::store(maxOf(a, b));
        } else if constexpr (std::is_integral_v<A>) {
            if constexpr (kOp == ReduceOp::kBand)
                return static_cast<T>(a & b);
            if constexpr (kOp == ReduceOp::kBor)
                return static_cast<T>(a | b);
            return static_cast<T>(a ^ b);
        } else {
            return a_stored;  // bitwise ops on floats are refused before launch
        }
    }
}

// AVG's last step: the sum divided by the number of inputs.
template <typename T>
__device__ __forceinline__ T divideBy(T sum, int n) {
    using E = Elem<T>;
    return E::store(E::load(sum) / static_cast<typename E::Acc>(n));
}

}  // namespace mooncake::pg::device
