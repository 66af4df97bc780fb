// CPU reference for the EP kernel tests: deterministic per-rank inputs that
// every process can rebuild for every rank, and what dispatch and combine
// must produce from them (DeepEP's checks: the token index in the last 128
// columns, packed rows compared byte for byte, FP8 against a host quantizer,
// combine against an FP32 reduction).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "mooncake-ep/core/fp8_rule.h"
#include "mooncake-ep/core/handle.h"

namespace mooncake::ep::test {

struct Shape {
    int num_ranks;
    int num_experts;
    int max_tokens;
    int hidden;
    int top_k;
    int nle() const { return num_experts / num_ranks; }
    int64_t capacity() const { return static_cast<int64_t>(num_ranks) * max_tokens; }
};

inline uint16_t bf16Bits(float v) {
    __nv_bfloat16_raw raw = __float2bfloat16_rn(v);
    return raw.x;
}
inline float bf16Value(uint16_t bits) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
}

// One rank's inputs for one iteration.
struct RankInputs {
    int num_tokens = 0;
    std::vector<uint16_t> x;          // BF16 [num_tokens, hidden]
    std::vector<int64_t> topk_idx;    // [num_tokens, top_k]
    std::vector<float> topk_weights;  // [num_tokens, top_k]
};

// Rows vary per rank, token and channel; channels [0, 128) of every fifth
// token are zero (the amax floor); the last 128 channels hold the token index.
// Experts per token are distinct; about one entry in five is -1.
inline RankInputs makeInputs(const Shape& s, int rank, int iteration, int num_tokens) {
    RankInputs in;
    in.num_tokens = num_tokens;
    std::mt19937 rng(static_cast<uint32_t>(1000003 * iteration + 7919 * rank + 17));
    std::uniform_real_distribution<float> value(-3.0f, 3.0f), weight(0.1f, 1.0f);
    in.x.resize(static_cast<size_t>(num_tokens) * s.hidden);
    for (int t = 0; t < num_tokens; ++t) {
        const float gain = 1.0f + static_cast<float>((t + rank) % 7);  // varied amax per row
        for (int c = 0; c < s.hidden; ++c) {
            float v = value(rng) * gain;
            if (c >= s.hidden - 128)
                v = static_cast<float>(t);
            else if (c < 128 && t % 5 == 0)
                v = 0.0f;
            in.x[static_cast<size_t>(t) * s.hidden + c] = bf16Bits(v);
        }
    }
    std::vector<int> experts(s.num_experts);
    in.topk_idx.resize(static_cast<size_t>(num_tokens) * s.top_k);
    in.topk_weights.resize(in.topk_idx.size());
    for (int t = 0; t < num_tokens; ++t) {
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), rng);
        for (int k = 0; k < s.top_k; ++k) {
            const size_t i = static_cast<size_t>(t) * s.top_k + k;
            in.topk_idx[i] = (t + 3 * k + iteration) % 5 == 0 ? -1 : experts[k];
            in.topk_weights[i] = weight(rng);
        }
    }
    return in;
}

// The host quantizer: FP8 bytes and scales of one row, by the rule in fp8_rule.h.
inline void quantizeRow(const uint16_t* row, int hidden, uint8_t* data, float* scales) {
    for (int g = 0; g < hidden / kEpFp8GroupSize; ++g) {
        float amax = 0.0f;
        for (int c = 0; c < kEpFp8GroupSize; ++c)
            amax = std::max(amax, std::fabs(bf16Value(row[g * kEpFp8GroupSize + c])));
        amax = std::max(amax, kEpFp8AmaxFloor);
        const float inv = kEpFp8Max / amax;
        for (int c = 0; c < kEpFp8GroupSize; ++c) {
            const int i = g * kEpFp8GroupSize + c;
            __nv_fp8_e4m3 q(bf16Value(row[i]) * inv);
            std::memcpy(&data[i], &q, 1);
        }
        scales[g] = amax / kEpFp8Max;
    }
}

// What local expert `le` of rank `me` receives: (source rank, token) pairs in
// packed order. Sources with active[src] == 0 send nothing; ids outside
// [0, num_experts) select nothing.
struct PackedRow {
    int src;
    int token;
};
inline std::vector<PackedRow> expectedRows(const Shape& s, const std::vector<RankInputs>& all,
                                           const std::vector<int>& active, int me, int le) {
    std::vector<PackedRow> rows;
    const int64_t expert = static_cast<int64_t>(me) * s.nle() + le;
    for (int src = 0; src < s.num_ranks; ++src) {
        if (!active[src])
            continue;
        const RankInputs& in = all[src];
        for (int t = 0; t < in.num_tokens; ++t) {
            const int64_t* ids = &in.topk_idx[static_cast<size_t>(t) * s.top_k];
            if (std::find(ids, ids + s.top_k, expert) != ids + s.top_k)
                rows.push_back({src, t});
        }
    }
    return rows;
}

// The test's expert: y = x * (1 + (expert % 4) / 4), rounded to BF16.
inline uint16_t expertOutput(uint16_t x, int64_t expert) {
    return bf16Bits(bf16Value(x) * (1.0f + static_cast<float>(expert % 4) / 4.0f));
}

// out[t] = sum over k of w * y_e[t] in FP32 (fused multiply-add in k order,
// as the kernel), skipping -1, bad ids and experts of inactive ranks.
inline std::vector<float> expectedCombine(const Shape& s, const RankInputs& in,
                                          const std::vector<int>& active) {
    std::vector<float> out(static_cast<size_t>(in.num_tokens) * s.hidden, 0.0f);
    for (int t = 0; t < in.num_tokens; ++t) {
        for (int c = 0; c < s.hidden; ++c) {
            float acc = 0.0f;
            for (int k = 0; k < s.top_k; ++k) {
                const size_t i = static_cast<size_t>(t) * s.top_k + k;
                const int64_t e = in.topk_idx[i];
                if (e < 0 || e >= s.num_experts || !active[e / s.nle()])
                    continue;
                const uint16_t y = expertOutput(in.x[static_cast<size_t>(t) * s.hidden + c], e);
                acc = std::fma(in.topk_weights[i], bf16Value(y), acc);
            }
            out[static_cast<size_t>(t) * s.hidden + c] = acc;
        }
    }
    return out;
}

// DeepEP's similarity measure: 1 - 2 sum(xy) / sum(x^2 + y^2).
inline double calcDiff(const std::vector<float>& a, const std::vector<float>& b) {
    double xy = 0, sq = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        xy += static_cast<double>(a[i]) * b[i];
        sq += static_cast<double>(a[i]) * a[i] + static_cast<double>(b[i]) * b[i];
    }
    return sq == 0 ? 0.0 : 1.0 - 2.0 * xy / sq;
}

}  // namespace mooncake::ep::test
