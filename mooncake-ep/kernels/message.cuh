// One dispatch message, written by the sender and unpacked by the receiver
// (one warp each). Shared by the cuda_ipc kernels (dispatch.cu) and the NCCL
// device-API kernels (mooncake-ep/nccl): both move the same bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "mooncake-ep/core/fp8_rule.h"
#include "mooncake-ep/kernels/ep_kernels.h"

namespace mooncake::ep {

// Words each lane has in flight in the copy loops below. A loop that stores
// one word before it loads the next waits a full memory round trip per word
// (the compiler cannot move a load above a store that may alias it), so the
// loads of a batch are issued together, then their stores.
inline constexpr int kEpCopyBatch = 4;

// One warp copies `count` 16-byte words from `src` to `dst` (apart), with
// `load` reading one source word (plain, or __ldcg for words a peer wrote).
template <typename Load>
__device__ __forceinline__ void epWarpCopy16(int4* dst, const int4* src, int64_t count, int lane,
                                             Load load) {
    int64_t i = lane;
    for (; i + (kEpCopyBatch - 1) * 32 < count; i += kEpCopyBatch * 32) {
        int4 v[kEpCopyBatch];
#pragma unroll
        for (int b = 0; b < kEpCopyBatch; ++b)
            v[b] = load(src + i + b * 32);
#pragma unroll
        for (int b = 0; b < kEpCopyBatch; ++b)
            dst[i + b * 32] = v[b];
    }
    for (; i < count; i += 32)
        dst[i] = load(src + i);
}

__device__ __forceinline__ int4 epLoadPlain(const int4* p) {
    return *p;
}
__device__ __forceinline__ int4 epLoadFromL2(const int4* p) {
    return __ldcg(p);
}

// Where one copy of a token's row goes: a message in a receive region
// (header, payload, scales after it), or a row of a direct receive.
struct EpRowDest {
    char* payload;
    float* scales;  // FP8 only
    int32_t* src;   // the source token index
};

__device__ inline EpRowDest epMessageDest(const EpLayout& L, char* msg) {
    return {msg + kEpMessageHeaderBytes, reinterpret_cast<float*>(msg + L.fp8ScaleOffset()),
            reinterpret_cast<int32_t*>(msg)};
}

// One warp writes share `part` of `parts` of token `token`'s row to each of
// dests[0, n): an even share of its 16-byte words (BF16) or of its
// 128-channel groups (FP8, each with its scale); share 0 also writes the
// source index. The token's share is read and quantized once, whatever n.
__device__ inline void epWriteMessageParts(const EpGroupArgs& g, const DispatchArgs& a, int token,
                                           const EpRowDest* dests, int n, int part, int parts,
                                           int lane) {
    if (part == 0 && lane == 0) {
        for (int m = 0; m < n; ++m)
            *dests[m].src = token;
    }
    const int64_t hidden = g.hidden;
    const char* row = static_cast<const char*>(a.x) + static_cast<int64_t>(token) * hidden * 2;
    if (!a.use_fp8) {
        const int64_t words = hidden / 8;
        const int64_t begin = words * part / parts, end = words * (part + 1) / parts;
        const int4* src = reinterpret_cast<const int4*>(row);
        for (int64_t first = begin; first < end; first += kEpCopyBatch * 32) {
            int4 v[kEpCopyBatch];
#pragma unroll
            for (int b = 0; b < kEpCopyBatch; ++b) {
                const int64_t i = first + b * 32 + lane;
                if (i < end)
                    v[b] = src[i];
            }
            for (int m = 0; m < n; ++m) {
                int4* dst = reinterpret_cast<int4*>(dests[m].payload);
#pragma unroll
                for (int b = 0; b < kEpCopyBatch; ++b) {
                    const int64_t i = first + b * 32 + lane;
                    if (i < end)
                        dst[i] = v[b];
                }
            }
        }
        return;
    }
    const int64_t groups = hidden / kEpFp8GroupSize;
    const int64_t begin = groups * part / parts, end = groups * (part + 1) / parts;
    // Eight lanes per group, 16 channels (32 bytes read, 16 written) per
    // lane: a warp stores 512 contiguous bytes per pass, four groups.
    constexpr int kLanesPerGroup = 8;
    constexpr int kGroupsPerPass = 32 / kLanesPerGroup;
    constexpr int kChannelsPerLane = kEpFp8GroupSize / kLanesPerGroup;
    static_assert(kChannelsPerLane == 16, "a lane's channels fill raw[2] and w[4] below");
    const int sub = lane % kLanesPerGroup;
    // Every load of a batch of passes is issued before the first store (as
    // in epWarpCopy16): the stores may alias the row for all the compiler
    // knows, so a pass-by-pass loop waits a memory round trip per pass.
    constexpr int kPassBatch = 2;
    for (int64_t first = begin; first < end; first += kGroupsPerPass * kPassBatch) {
        uint4 raw[kPassBatch][2];
#pragma unroll
        for (int b = 0; b < kPassBatch; ++b) {
            const int64_t group = first + b * kGroupsPerPass + lane / kLanesPerGroup;
            raw[b][0] = raw[b][1] = make_uint4(0, 0, 0, 0);
            if (group < end) {
                const uint4* src = reinterpret_cast<const uint4*>(
                    row + (group * kEpFp8GroupSize + sub * kChannelsPerLane) * 2);
                raw[b][0] = src[0];
                raw[b][1] = src[1];
            }
        }
#pragma unroll
        for (int b = 0; b < kPassBatch; ++b) {
            const int64_t group = first + b * kGroupsPerPass + lane / kLanesPerGroup;
            const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(raw[b]);
            float v[16];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                v[2 * i] = __low2float(h[i]);
                v[2 * i + 1] = __high2float(h[i]);
            }
            float amax = 0.f;
#pragma unroll
            for (int i = 0; i < 16; ++i)
                amax = fmaxf(amax, fabsf(v[i]));
            for (int off = kLanesPerGroup / 2; off > 0; off >>= 1)  // within the group's lanes
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            amax = fmaxf(amax, kEpFp8AmaxFloor);
            const float inv = kEpFp8Max / amax;
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const __nv_fp8x2_storage_t q01 = __nv_cvt_float2_to_fp8x2(
                    make_float2(v[4 * i] * inv, v[4 * i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
                const __nv_fp8x2_storage_t q23 = __nv_cvt_float2_to_fp8x2(
                    make_float2(v[4 * i + 2] * inv, v[4 * i + 3] * inv), __NV_SATFINITE, __NV_E4M3);
                w[i] = static_cast<uint32_t>(q01) | (static_cast<uint32_t>(q23) << 16);
            }
            if (group < end) {
                for (int m = 0; m < n; ++m) {
                    *reinterpret_cast<uint4*>(dests[m].payload + group * kEpFp8GroupSize +
                                              sub * kChannelsPerLane) =
                        make_uint4(w[0], w[1], w[2], w[3]);
                    if (sub == 0)
                        dests[m].scales[group] = amax / kEpFp8Max;
                }
            }
        }
    }
}

// One warp writes one token's message: header, then BF16 or FP8 + scales.
__device__ inline void epWriteMessage(const EpGroupArgs& g, const DispatchArgs& a,
                                      const EpLayout& L, int token, char* msg, int lane) {
    const EpRowDest dest = epMessageDest(L, msg);
    epWriteMessageParts(g, a, token, &dest, 1, 0, 1, lane);
}

// Copies one received row (one warp), wherever it arrived (a message, or a
// slot's row of a direct dispatch: `src`), into packed row `row` of its expert.
__device__ inline void epUnpackRow(const EpGroupArgs& g, const DispatchArgs& a,
                                   const EpRowDest& src, int64_t row, int lane) {
    const int64_t hidden = g.hidden;
    if (lane == 0)
        a.src_info[row] = __ldcg(src.src);
    const int64_t data_bytes = a.use_fp8 ? hidden : 2 * hidden;
    epWarpCopy16(reinterpret_cast<int4*>(static_cast<char*>(a.packed_recv_x) + row * data_bytes),
                 reinterpret_cast<const int4*>(src.payload), data_bytes / 16, lane, epLoadFromL2);
    if (a.use_fp8) {
        const int64_t groups = hidden / kEpFp8GroupSize;
        for (int64_t i = lane; i < groups; i += 32)
            a.packed_recv_scales[row * groups + i] = __ldcg(src.scales + i);
    }
}

}  // namespace mooncake::ep
