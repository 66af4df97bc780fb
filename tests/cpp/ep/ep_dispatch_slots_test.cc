// Host checks of the token-major send's slot rule (core/dispatch_slots.h):
// the block-wise computation the kernel runs (threads' shares of the count,
// then the block's earlier tokens) gives every message the slot a direct
// count of earlier selecting tokens gives, the slots of an expert are
// 0..count-1 exactly once, and the send's per-expert totals equal the count
// of selecting tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "mooncake-ep/core/dispatch_slots.h"

namespace mooncake::ep {
namespace {

// Random top-k ids with -1 entries and repeated experts in a row.
std::vector<int> randomIds(int tokens, int top_k, int experts, std::mt19937& rng) {
    std::uniform_int_distribution<int> id(-1, experts - 1);
    std::uniform_int_distribution<int> coin(0, 9);
    std::vector<int> ids(static_cast<size_t>(tokens) * top_k);
    for (int t = 0; t < tokens; ++t) {
        for (int k = 0; k < top_k; ++k) {
            int& v = ids[t * top_k + k];
            v = id(rng);
            if (k > 0 && coin(rng) == 0)
                v = ids[t * top_k + k - 1];  // listed twice: one message
        }
    }
    return ids;
}

// Slots as the kernel computes them: per block, `threads` shares of the
// count of the tokens before it, then epSlotInBlock per distinct expert of
// each token. Returns [token][expert] -> slot (-1: no message).
std::vector<std::vector<int>> blockwiseSlots(const std::vector<int>& ids, int tokens, int top_k,
                                             int experts, int tokens_per_block, int threads) {
    std::vector<std::vector<int>> slots(tokens, std::vector<int>(experts, -1));
    for (int first = 0; first < tokens; first += tokens_per_block) {
        std::vector<int> counts(experts, 0);
        for (int thread = 0; thread < threads; ++thread) {
            epCountSelections(ids.data(), top_k, first, thread, threads,
                              [&](int e) { ++counts[e]; });
        }
        for (int token = first; token < std::min(tokens, first + tokens_per_block); ++token) {
            for (int k = 0; k < top_k; ++k) {
                const int i = token * top_k + k;
                if (epFirstInRow(ids.data(), top_k, i)) {
                    slots[token][ids[i]] =
                        epSlotInBlock(ids.data(), top_k, counts.data(), first, token, ids[i]);
                }
            }
        }
    }
    return slots;
}

TEST(EpDispatchSlots, BlockwiseSlotsAreTheEarlierSelectingTokensDenseAndCounted) {
    std::mt19937 rng(20261206);
    struct Shape {
        int tokens, top_k, experts, tokens_per_block, threads;
    };
    for (const Shape s :
         {Shape{128, 8, 256, 2, 256}, Shape{1, 1, 1, 2, 256}, Shape{37, 16, 12, 4, 64},
          Shape{257, 3, 5, 2, 32}, Shape{64, 8, 16, 8, 1}}) {
        const std::vector<int> ids = randomIds(s.tokens, s.top_k, s.experts, rng);
        const auto slots =
            blockwiseSlots(ids, s.tokens, s.top_k, s.experts, s.tokens_per_block, s.threads);
        // The whole table's count, as the send's last block signals it.
        std::vector<int> totals(s.experts, 0);
        for (int thread = 0; thread < s.threads; ++thread) {
            epCountSelections(ids.data(), s.top_k, s.tokens, thread, s.threads,
                              [&](int e) { ++totals[e]; });
        }
        for (int e = 0; e < s.experts; ++e) {
            int earlier = 0;  // tokens before this one that selected e
            std::set<int> seen;
            for (int t = 0; t < s.tokens; ++t) {
                const bool selects =
                    std::count(ids.begin() + t * s.top_k, ids.begin() + (t + 1) * s.top_k, e) > 0;
                ASSERT_EQ(slots[t][e], selects ? earlier : -1)
                    << "token " << t << " expert " << e << " tokens " << s.tokens;
                if (selects) {
                    EXPECT_TRUE(seen.insert(slots[t][e]).second);
                    ++earlier;
                }
            }
            EXPECT_EQ(totals[e], earlier) << "expert " << e;
            EXPECT_EQ(static_cast<int>(seen.size()), earlier);
            if (earlier > 0) {
                EXPECT_EQ(*seen.begin(), 0);
                EXPECT_EQ(*seen.rbegin(), earlier - 1);
            }
        }
    }
}

TEST(EpDispatchSlots, RepeatedAndMissingEntriesSendNothingExtra) {
    // Token 0 lists expert 2 twice and has a -1; token 1 selects 2 once.
    const std::vector<int> ids = {2, 2, -1, 1, 2, 3};
    EXPECT_TRUE(epFirstInRow(ids.data(), 3, 0));
    EXPECT_FALSE(epFirstInRow(ids.data(), 3, 1));
    EXPECT_FALSE(epFirstInRow(ids.data(), 3, 2));
    const int counts_before[4] = {0, 0, 0, 0};
    EXPECT_EQ(epSlotInBlock(ids.data(), 3, counts_before, 0, 1, 2), 1);
    EXPECT_EQ(epSlotInBlock(ids.data(), 3, counts_before, 0, 1, 1), 0);
    EXPECT_EQ(epSlotInBlock(ids.data(), 3, counts_before, 0, 1, 3), 0);
}

}  // namespace
}  // namespace mooncake::ep
