// Reducing the members' copies of a range over all threads of a grid, in
// rank order with the CPU core's element semantics (reduce_ops.cuh), so the
// result is bit-identical to the one-shot all_reduce and to mooncake-cpu.
#pragma once

#include <cstdint>

#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-pg/device/reduce_ops.cuh"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

// Where member `src`'s copy of element 0 lives: this rank's own input for
// itself (it is never staged), the member's region of `parity` at
// `window_offset` bytes for the others.
template <typename T>
__device__ __forceinline__ const T* memberCopy(const DeviceGroupView& g, int src, int parity,
                                               uint64_t window_offset, const T* own) {
    if (src == g.rank)
        return own;
    return reinterpret_cast<const T*>(region(g, src, parity) + window_offset);
}

// Member `src`'s copy of element 0 in a window-staged reduction.
template <typename T>
struct WindowCopies {
    const DeviceGroupView& g;
    int parity;
    uint64_t window_offset;
    const T* own;
    __device__ const T* operator()(int src) const {
        return memberCopy(g, src, parity, window_offset, own);
    }
};

// Member `src`'s copy at `lo` elements into its own buffer (mapped here).
template <typename T>
struct MemberBufferCopies {
    const void* const* bases;
    uint64_t lo;
    __device__ const T* operator()(int src) const { return static_cast<const T*>(bases[src]) + lo; }
};

// Where a reduction's results go: `out`, and `out2` when it is not null.
template <typename T>
struct OneOrTwoOutputs {
    T* out;
    T* out2;
    __device__ int count() const { return out2 ? 2 : 1; }
    __device__ T* operator()(int k) const { return k == 0 ? out : out2; }
};

// Every member's own output at `lo` elements (mapped here).
template <typename T>
struct MemberBufferOutputs {
    void* const* bases;
    uint64_t lo;
    int size;
    __device__ int count() const { return size; }
    __device__ T* operator()(int k) const { return static_cast<T*>(bases[k]) + lo; }
};

// acc = acc combined with x, element by element (one 16-byte vector).
template <typename T, ReduceOp kOp>
__device__ __forceinline__ void combineVector(int4& acc, const int4& x) {
    constexpr int kPer = 16 / sizeof(T);
    T* a = reinterpret_cast<T*>(&acc);
    const T* b = reinterpret_cast<const T*>(&x);
#pragma unroll
    for (int k = 0; k < kPer; ++k)
        a[k] = combine<T, kOp>(a[k], b[k]);
}

// The end of a vector's reduction over `size` members: AVG divides.
template <typename T, ReduceOp kOp>
__device__ __forceinline__ void finishVector(int4& acc, int size) {
    if constexpr (kOp == ReduceOp::kAvg) {
        constexpr int kPer = 16 / sizeof(T);
        T* a = reinterpret_cast<T*>(&acc);
#pragma unroll
        for (int k = 0; k < kPer; ++k)
            a[k] = divideBy(a[k], size);
    }
}

// Vectors v, v + stride, ... (kVectors of them) reduced over the members and
// stored to every output: all of a member's loads are issued before any is
// combined, so each thread keeps kVectors loads in flight (the reduction is
// bound by memory latency otherwise).
template <typename T, ReduceOp kOp, int kVectors, class Copies, class Outputs>
__device__ __forceinline__ void reduceVectors(int size, const Copies& copies, const Outputs& outs,
                                              uint64_t v, uint64_t stride) {
    int4 acc[kVectors];
#pragma unroll
    for (int u = 0; u < kVectors; ++u)
        acc[u] = reinterpret_cast<const int4*>(copies(0))[v + u * stride];
    for (int src = 1; src < size; ++src) {
        int4 x[kVectors];
#pragma unroll
        for (int u = 0; u < kVectors; ++u)
            x[u] = reinterpret_cast<const int4*>(copies(src))[v + u * stride];
#pragma unroll
        for (int u = 0; u < kVectors; ++u)
            combineVector<T, kOp>(acc[u], x[u]);
    }
    const int outputs = outs.count();
#pragma unroll
    for (int u = 0; u < kVectors; ++u) {
        finishVector<T, kOp>(acc[u], size);
        for (int k = 0; k < outputs; ++k)
            reinterpret_cast<int4*>(outs(k))[v + u * stride] = acc[u];
    }
}

// outs(k)[i] for every k < outs.count() = the `size` members' element i
// combined in rank order, member src's copy starting at copies(src), for i
// in [0, n). 16-byte vectors, four per thread at a time, when every pointer
// allows (`address_bits`: the copies' and outputs' addresses or-ed
// together), element by element otherwise.
template <typename T, ReduceOp kOp, class Copies, class Outputs>
__device__ void gridReduceCopiesTo(int size, const Copies& copies, const Outputs& outs,
                                   uintptr_t address_bits, uint64_t n) {
    constexpr int kPer = 16 / sizeof(T);
    constexpr int kInFlight = 4;
    const uint64_t t = globalThread(), nt = globalThreads();
    const int outputs = outs.count();
    uint64_t done = 0;
    if ((address_bits & 15) == 0) {
        const uint64_t vectors = n / kPer;
        uint64_t v = t;
        for (; v + (kInFlight - 1) * nt < vectors; v += kInFlight * nt)
            reduceVectors<T, kOp, kInFlight>(size, copies, outs, v, nt);
        for (; v < vectors; v += nt)
            reduceVectors<T, kOp, 1>(size, copies, outs, v, nt);
        done = vectors * kPer;
    }
    for (uint64_t i = done + t; i < n; i += nt) {
        T acc = copies(0)[i];
        for (int src = 1; src < size; ++src)
            acc = combine<T, kOp>(acc, copies(src)[i]);
        if constexpr (kOp == ReduceOp::kAvg)
            acc = divideBy(acc, size);
        for (int k = 0; k < outputs; ++k)
            outs(k)[i] = acc;
    }
}

// As gridReduceCopiesTo into `out`, and `out2` when it is not null;
// `copy_bits`: the copies' addresses or-ed together.
template <typename T, ReduceOp kOp, class Copies>
__device__ void gridReduceCopies(int size, const Copies& copies, uintptr_t copy_bits, T* out,
                                 T* out2, uint64_t n) {
    const uintptr_t bits =
        copy_bits | reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(out2);
    gridReduceCopiesTo<T, kOp>(size, copies, OneOrTwoOutputs<T>{out, out2}, bits, n);
}

// The members' copies staged in their windows (this rank's own: `own`).
template <typename T, ReduceOp kOp>
__device__ void gridReduce(const DeviceGroupView& g, int parity, uint64_t window_offset,
                           const T* own, T* out, T* out2, uint64_t n) {
    // Regions start 16-byte aligned: only the offset and `own` decide.
    gridReduceCopies<T, kOp>(g.size, WindowCopies<T>{g, parity, window_offset, own},
                             reinterpret_cast<uintptr_t>(own) | window_offset, out, out2, n);
}

// Member r's piece [*lo, *hi) of `len` elements split among `size`: equal
// pieces of whole 16-byte vectors, so every piece starts aligned.
template <typename T>
__device__ __forceinline__ void memberPiece(uint64_t len, int size, int r, uint64_t* lo,
                                            uint64_t* hi) {
    constexpr uint64_t kPer = 16 / sizeof(T);
    const uint64_t per = (len + size - 1) / size;
    const uint64_t rounded = (per + kPer - 1) / kPer * kPer;
    *lo = min(static_cast<uint64_t>(r) * rounded, len);
    *hi = min(*lo + rounded, len);
}

}  // namespace mooncake::pg::device
