// Host-only checks of the EP core: the buffer layout (regions disjoint,
// aligned, inside the size hint, which matches the documented formula), the
// signal and handle encodings, the launch argument checks (they fail before
// any CUDA call, so they run without a GPU), and the host FP8 quantizer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "mooncake-ep/core/signal_word.h"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "tests/cpp/ep/ep_reference.h"

namespace mooncake::ep {
namespace {

TEST(EpLayout, SizeHintIsTheDocumentedFormula) {
    for (int64_t m : {1, 48, 128}) {
        for (int64_t h : {128, 7168, 8192}) {
            for (auto [r, e] : {std::pair<int64_t, int64_t>{1, 1}, {2, 32}, {8, 256}}) {
                const int64_t signals = epAlignUp(16 * e, 256);
                const int64_t half = signals + e * m * (128 + 2 * h) + e * m * 2 * h;
                EXPECT_EQ(epBufferSizeHint(m, h, r, e), 256 + 2 * half) << m << " " << h;
            }
        }
    }
    // The benchmark shape of issue 11: 128 tokens, hidden 7168, 8 ranks, 256 experts.
    EXPECT_EQ(epBufferSizeHint(128, 7168, 8, 256),
              256 + 2 * (4096 + 256LL * 128 * (128 + 4 * 7168)));
}

TEST(EpLayout, RegionsAreDisjointAlignedAndInside) {
    const EpLayout L{4, 16, 32, 7168};
    const int64_t total = epBufferSizeHint(32, 7168, 4, 16);
    for (int phase = 0; phase < 2; ++phase) {
        const int64_t half = L.halfOffset(phase);
        EXPECT_GE(half, kEpStateBytes);
        // Signals first, then messages, then combine rows, then the next half.
        EXPECT_EQ(L.dispatchCountOffset(phase, 0, 0), half);
        EXPECT_LT(L.combineFlagOffset(phase, 15) + 8, L.dispatchMessageOffset(phase, 0, 0, 0) + 1);
        EXPECT_EQ(L.combineFlagOffset(phase, 0), L.dispatchCountOffset(phase, 3, 3) + 8);
        EXPECT_EQ(L.dispatchMessageOffset(phase, 3, 3, 31) + L.messageBytes(),
                  L.combineRowOffset(phase, 0, 0));
        EXPECT_EQ(L.combineRowOffset(phase, 15, 31) + 2 * 7168, half + L.halfBytes());
        EXPECT_EQ(L.dispatchMessageOffset(phase, 1, 2, 3) % 16, 0);
        EXPECT_EQ(L.combineRowOffset(phase, 5, 7) % 16, 0);
        EXPECT_EQ((L.dispatchMessageOffset(phase, 0, 0, 0) + L.fp8ScaleOffset()) % 16, 0);
    }
    EXPECT_EQ(L.halfOffset(1) + L.halfBytes(), total);
    // The FP8 payload (data + scales) fits in the BF16-sized slot.
    EXPECT_LE(L.fp8ScaleOffset() + 4 * 7168 / 128, L.messageBytes());
}

TEST(EpLayout, DirectAreaFollowsTheHalvesDisjointAlignedAndInside) {
    const EpLayout L{4, 16, 32, 7168};  // 4 local experts, 128 rows each
    const int64_t nle = 4, cap = 128, groups = 7168 / 128;
    EXPECT_EQ(L.capacity(), cap);
    // Header: reservation words, the two names, the base words of both halves.
    EXPECT_EQ(L.directReserveOffset(0), L.totalBytes());
    EXPECT_EQ(L.directNameOffset(0), L.directReserveOffset(15) + 8);
    EXPECT_EQ(L.directNameOffset(1), L.directNameOffset(0) + 8);
    EXPECT_EQ(L.directBaseOffset(0, 0, 0), L.directNameOffset(1) + 8);
    EXPECT_EQ(L.directBaseOffset(1, 0, 0), L.directBaseOffset(0, nle - 1, 3) + 8);
    EXPECT_LE(L.directBaseOffset(1, nle - 1, 3) + 8, L.directSlotOffset(0));
    EXPECT_EQ(L.directSlotOffset(0), L.totalBytes() + L.directHeaderBytes());
    for (int slot = 0; slot < kEpDirectSlots; ++slot) {
        // Counters, then data, scales and src_info of [nle][cap] rows.
        EXPECT_EQ(L.directCounterOffset(slot, 0), L.directSlotOffset(slot));
        EXPECT_LE(L.directCounterOffset(slot, nle - 1) + 8, L.directDataOffset(slot));
        EXPECT_LE(L.directDataOffset(slot) + nle * cap * 7168, L.directScalesOffset(slot));
        EXPECT_LE(L.directScalesOffset(slot) + nle * cap * groups * 4, L.directSrcOffset(slot));
        EXPECT_LE(L.directSrcOffset(slot) + nle * cap * 4,
                  L.directSlotOffset(slot) + L.directSlotBytes());
        EXPECT_EQ(L.directDataOffset(slot) % 256, 0);  // rows start 16-byte aligned
        EXPECT_EQ(L.directScalesOffset(slot) % 16, 0);
        EXPECT_EQ(L.directSrcOffset(slot) % 16, 0);
        if (slot > 0) {
            EXPECT_EQ(L.directSlotOffset(slot), L.directSlotOffset(slot - 1) + L.directSlotBytes());
        }
    }
    EXPECT_EQ(L.directSlotOffset(kEpDirectSlots - 1) + L.directSlotBytes(), L.directTotalBytes());
    // About one FP8 receive per slot on top of the plain size.
    EXPECT_GE(L.directTotalBytes() - L.totalBytes(),
              kEpDirectSlots * nle * cap * (7168 + groups * 4 + 4));
}

TEST(EpSignal, CarriesSequenceAndCount) {
    const uint64_t w = epMakeSignal(7, 123);
    EXPECT_TRUE(epSignalMatches(w, 7));
    EXPECT_FALSE(epSignalMatches(w, 5));  // a stale word never satisfies a newer wait
    EXPECT_FALSE(epSignalMatches(w, 8));
    EXPECT_FALSE(epSignalMatches(0, 1));  // the zeroed buffer matches no operation
    EXPECT_EQ(epSignalPayload(w), 123u);
    EXPECT_TRUE(epSignalMatches(epMakeSignal((1ull << 32) + 3, 0), (1ull << 32) + 3));
}

TEST(EpHandle, LayoutRangeIsBeginHighCountLow) {
    const int64_t r = epEncodeRange(1000, 37);
    EXPECT_EQ(r, (int64_t{1000} << 32) | 37);
    EXPECT_EQ(epRangeBegin(r), 1000);
    EXPECT_EQ(epRangeCount(r), 37);
}

EpGroupArgs validGroup() {
    EpGroupArgs g;
    g.rank = 1;
    g.num_ranks = 2;
    g.num_experts = 8;
    g.max_tokens = 16;
    g.hidden = 256;
    g.local_buffer = reinterpret_cast<void*>(0x1000);
    g.local_buffer_bytes = static_cast<uint64_t>(epBufferSizeHint(16, 256, 2, 8));
    g.peer_buffers = reinterpret_cast<void* const*>(0x2000);
    g.active_ranks = reinterpret_cast<int32_t*>(0x3000);
    return g;
}

void expectInvalid(const Status& st, const std::string& says) {
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(says), std::string::npos) << st.toString();
}

TEST(EpLaunchChecks, NameTheArgumentTheValueAndTheExpectation) {
    EXPECT_TRUE(checkGroupArgs(validGroup()).ok());
    EpGroupArgs g = validGroup();
    g.hidden = 200;
    expectInvalid(checkGroupArgs(g), "hidden is 200, expected a positive multiple of 128");
    g = validGroup();
    g.num_experts = 7;
    expectInvalid(checkGroupArgs(g),
                  "num_experts is 7, expected a positive multiple of num_ranks (2)");
    g = validGroup();
    g.rank = 2;
    expectInvalid(checkGroupArgs(g), "rank is 2, expected in [0, 2)");
    g = validGroup();
    g.num_experts = kEpMaxExperts + 2;
    expectInvalid(checkGroupArgs(g),
                  "num_experts is 16386, expected a positive multiple of "
                  "num_ranks (2) up to 16384");
    g = validGroup();
    g.num_ranks = kEpDispatchReceiveMaxPairs + 1;
    expectInvalid(checkGroupArgs(g), "num_ranks is 4097, expected in [1, 4096]");
    g = validGroup();
    g.local_buffer_bytes -= 1;
    expectInvalid(checkGroupArgs(g), "local_buffer_bytes is");
    g = validGroup();
    g.hidden = 512;  // a larger hidden than the buffer was sized for
    expectInvalid(checkGroupArgs(g), "expected at least");

    DispatchArgs d;
    d.num_tokens = 17;
    d.top_k = 4;
    expectInvalid(checkDispatchArgs(validGroup(), d),
                  "num_tokens is 17, expected in [0, max_tokens = 16]");
    d.num_tokens = 0;
    d.top_k = 0;
    expectInvalid(checkDispatchArgs(validGroup(), d), "top_k is 0, expected in [1, 4096]");
    d.top_k = kEpCombineReceiveMaxEntries + 1;
    expectInvalid(checkDispatchArgs(validGroup(), d), "top_k is 4097, expected in [1, 4096]");
    d.top_k = 16;
    expectInvalid(checkDispatchArgs(validGroup(), d), "a dispatch output");
    // Launching validates first: no CUDA call is made for bad arguments.
    expectInvalid(launchDispatch(validGroup(), d, nullptr), "a dispatch output");
    CombineArgs cb;
    cb.top_k = 2;
    expectInvalid(launchCombine(validGroup(), cb, nullptr), "x, src_info or layout_range is null");
}

TEST(EpLaunchChecks, RowTensorsMustStartSixteenByteAligned) {
    // Stand-in addresses: the checks compare pointers and make no CUDA call.
    char* base = reinterpret_cast<char*>(uintptr_t{1} << 20);
    DispatchArgs d;
    d.num_tokens = 4;
    d.top_k = 2;
    d.x = base + 2;  // a BF16 view one element in
    d.topk_idx = reinterpret_cast<const int64_t*>(base + 4096);
    d.packed_recv_x = base + 8192;
    d.packed_recv_count = reinterpret_cast<int32_t*>(base + 12288);
    d.src_info = reinterpret_cast<int32_t*>(base + 16384);
    d.layout_range = reinterpret_cast<int64_t*>(base + 20480);
    expectInvalid(checkDispatchArgs(validGroup(), d),
                  "x starts 2 bytes past a 16-byte boundary, expected an aligned start");
    expectInvalid(launchDispatch(validGroup(), d, nullptr), "x starts 2 bytes past");
    d.x = base + 16 * 3;
    EXPECT_TRUE(checkDispatchArgs(validGroup(), d).ok());

    CombineArgs c;
    c.num_tokens = 4;
    c.top_k = 2;
    c.x = base + 8;
    c.src_info = reinterpret_cast<const int32_t*>(base + 4096);
    c.layout_range = reinterpret_cast<const int64_t*>(base + 8192);
    c.topk_idx = reinterpret_cast<const int64_t*>(base + 12288);
    c.topk_weights = reinterpret_cast<const float*>(base + 16384);
    c.out = base + 20480 + 14;
    expectInvalid(checkCombineArgs(validGroup(), c),
                  "x (expert outputs) starts 8 bytes past a 16-byte boundary");
    c.x = base;
    expectInvalid(checkCombineArgs(validGroup(), c), "out starts 14 bytes past");
    expectInvalid(launchCombine(validGroup(), c, nullptr), "out starts 14 bytes past");
    c.out = base + 20480;
    EXPECT_TRUE(checkCombineArgs(validGroup(), c).ok());
}

TEST(EpLaunchChecks, SendBlocksHaveAWarpPerRowTheyGetWithUniformRouting) {
    // 128 tokens x top-8 over 256 experts: 4 rows a block.
    EXPECT_EQ(epSendThreads(128 * 8, 256), 128);
    EXPECT_EQ(epSendThreads(160 * 8, 256), 256);   // 5 rows: 8 warps
    EXPECT_EQ(epSendThreads(256 * 8, 256), 256);   // 8 rows
    EXPECT_EQ(epSendThreads(300 * 8, 256), 512);   // 10 rows
    EXPECT_EQ(epSendThreads(4096 * 8, 256), 512);  // never more than 16 warps
    EXPECT_EQ(epSendThreads(0, 256), kEpMinSendThreads);
    EXPECT_EQ(epSendThreads(64, 0), kEpMinSendThreads);
}

TEST(EpLaunchChecks, DispatchReceiveBlocksOfRanksSharingTheGpuLeaveHalfItsSmsFree) {
    constexpr int kH200Sms = 132;
    EpGroupArgs g = validGroup();
    g.num_ranks = 8;
    g.num_experts = 256;  // 32 local experts
    g.ranks_per_device = 1;
    EXPECT_EQ(epDispatchReceiveBlocks(g, kH200Sms), 32);  // a block per local expert
    g.ranks_per_device = 8;                               // 8 blocks each: 64 of the 132 SMs
    EXPECT_EQ(epDispatchReceiveBlocks(g, kH200Sms), 8);
    EXPECT_LE(g.ranks_per_device * epDispatchReceiveBlocks(g, kH200Sms), kH200Sms / 2);
    g.ranks_per_device = 2;  // 33 each would be more than the experts
    EXPECT_EQ(epDispatchReceiveBlocks(g, kH200Sms), 32);
    g.ranks_per_device = 8;
    EXPECT_EQ(epDispatchReceiveBlocks(g, 4), 1);  // never an empty grid
}

TEST(EpLaunchChecks, DispatchReceiveBlocksWaitForAllTheirExpertsAtOnceWhileTheyFit) {
    // 32 local experts over 8 blocks: each waits for its 4 experts' 8 counts together.
    EXPECT_EQ(epDispatchReceiveExpertsPerRound(32, 8, 8), 4);
    EXPECT_EQ(epDispatchReceiveExpertsPerRound(33, 8, 8), 5);      // the first block has 5
    EXPECT_EQ(epDispatchReceiveExpertsPerRound(32, 8, 32), 1);     // a block per expert
    EXPECT_EQ(epDispatchReceiveExpertsPerRound(1024, 64, 1), 64);  // 4096 pairs: the limit
    EXPECT_EQ(epDispatchReceiveExpertsPerRound(1024, 4096, 1), 1);
    EpGroupArgs g = validGroup();
    g.num_ranks = 8;
    g.num_experts = 256;
    EXPECT_EQ(epDispatchReceiveSharedBytes(g, 8), 3 * sizeof(int) * 4 * 8);
    g.num_ranks = 64;
    g.num_experts = 64 * 128;  // within kEpMaxExperts: 128 local experts, rounds of 64 (4096 pairs)
    EXPECT_EQ(epDispatchReceiveSharedBytes(g, 1), 3 * sizeof(int) * kEpDispatchReceiveMaxPairs);
    EXPECT_LE(epDispatchReceiveSharedBytes(g, 1), 48u * 1024);
}

TEST(EpLaunchChecks, DispatchSendIsTokenMajorWhereItsSharedMemoryAndTopKFit) {
    if (std::getenv("MC_EP_DISPATCH_SEND_BY_TOKEN")) {
        GTEST_SKIP() << "MC_EP_DISPATCH_SEND_BY_TOKEN is set";
    }
    EpGroupArgs g = validGroup();
    g.num_ranks = 8;
    g.num_experts = 256;
    DispatchArgs a;
    a.num_tokens = 128;  // ids and counts: 4 * (1024 + 256) bytes
    a.top_k = 8;
    a.use_fp8 = true;
    EXPECT_EQ(epDispatchSendByTokenSharedBytes(g, a), 4u * (1024 + 256));
    EXPECT_TRUE(epDispatchSendByToken(g, a));
    EXPECT_EQ(epDispatchSendBlocks(g, a), 64);  // two tokens a block
    a.num_tokens = 0;
    EXPECT_EQ(epDispatchSendBlocks(g, a), 1);  // the counts still go out
    a.num_tokens = 128;
    a.top_k = kEpMaxTopKByToken + 1;
    EXPECT_FALSE(epDispatchSendByToken(g, a));
    EXPECT_EQ(epDispatchSendBlocks(g, a), 256);  // a block per global expert
    a.top_k = 8;
    a.num_tokens = 4096;  // 128 KiB of ids
    EXPECT_FALSE(epDispatchSendByToken(g, a));
    a.num_tokens = 128;
    a.use_fp8 = false;  // BF16: nothing to quantize once
    EXPECT_FALSE(epDispatchSendByToken(g, a));
}

TEST(EpLaunchChecks, RanksSharingTheGpuSplitTheirReceivesAndCopyWithFullGrids) {
    EpGroupArgs g = validGroup();
    g.num_ranks = 8;
    g.num_experts = 256;
    EXPECT_FALSE(epSplitReceive(g));  // one rank per GPU: its grids are full already
    g.ranks_per_device = 8;
    const bool knobs = std::getenv("MC_EP_SPLIT_RECEIVE") ||
                       std::getenv("MC_EP_DISPATCH_RECV_BLOCKS") ||
                       std::getenv("MC_EP_COMBINE_RECV_BLOCKS");
    if (!knobs) {
        EXPECT_TRUE(epSplitReceive(g));
    }
    if (!std::getenv("MC_EP_DISPATCH_RECV_BLOCKS")) {
        EXPECT_EQ(epDispatchReceiveGrid(g, true), 32);  // a block per local expert
    }
    if (!std::getenv("MC_EP_COMBINE_RECV_BLOCKS")) {
        EXPECT_EQ(epCombineReceiveGrid(g, 128, true), 128);  // a block per token
        EXPECT_EQ(epCombineReceiveGrid(g, 0, true), 1);
    }
}

TEST(EpLaunchChecks, CombineReceiveBlocksWaitForAllTheirTokensExpertsAtOnceWhileTheyFit) {
    // 128 tokens over 8 blocks: 16 each, 128 top-8 entries.
    EXPECT_EQ(epCombineReceiveTokensPerRound(128, 8, 8), 16);
    EXPECT_EQ(epCombineReceiveTokensPerRound(128, 8, 128), 1);    // a block per token
    EXPECT_EQ(epCombineReceiveTokensPerRound(0, 8, 1), 1);        // an empty op has no round
    EXPECT_EQ(epCombineReceiveTokensPerRound(4096, 16, 1), 256);  // 4096 entries: the limit
    EXPECT_EQ(epCombineReceiveTokensPerRound(8, kEpCombineReceiveMaxEntries, 1), 1);
    EpGroupArgs g = validGroup();
    g.num_ranks = 8;
    g.num_experts = 248;  // a byte per expert, rounded up to 16
    CombineArgs a;
    a.num_tokens = 128;
    a.top_k = 8;
    EXPECT_EQ(epCombineReceiveSharedBytes(g, a, 8), 256 + sizeof(int) * 16 * 8);
    g.num_experts = kEpMaxExperts;
    a.num_tokens = 4096;
    a.top_k = 16;
    EXPECT_LE(epCombineReceiveSharedBytes(g, a, 1), 48u * 1024);
    a.top_k = kEpCombineReceiveMaxEntries;
    EXPECT_LE(epCombineReceiveSharedBytes(g, a, 1), 48u * 1024);
}

TEST(EpLaunchChecks, CombineReceiveGridIsBoundedOnlyWhenRanksShareTheGpu) {
    constexpr int kH100Sms = 132;
    EpGroupArgs g = validGroup();                          // two ranks, one per GPU
    EXPECT_EQ(epCombineReceiveBlocks(g, 0, kH100Sms), 1);  // a block finishes an empty op
    EXPECT_EQ(epCombineReceiveBlocks(g, 4096, kH100Sms), 4096);
    g.ranks_per_device = 2;  // 33 blocks each: 66 of the 132 SMs
    EXPECT_EQ(epCombineReceiveBlocks(g, 4096, kH100Sms), 33);
    EXPECT_EQ(epCombineReceiveBlocks(g, 20, kH100Sms), 20);
    EXPECT_EQ(epCombineReceiveBlocks(g, 0, kH100Sms), 1);
    EXPECT_EQ(epCombineReceiveBlocks(g, 4096, 1), 1);  // never an empty grid
    g.num_ranks = 8;
    g.num_experts = 256;
    g.ranks_per_device = 8;  // ep_benchmark's 8 processes, 128 tokens: 8 blocks each
    EXPECT_EQ(epCombineReceiveBlocks(g, 128, kH100Sms), 8);
    EXPECT_LE(g.ranks_per_device * epCombineReceiveBlocks(g, 128, kH100Sms), kH100Sms / 2);
    // Fewer blocks, larger ones: a 1024-thread block takes a 7168-channel
    // row in one pass (unless a benchmark's setting forces the size).
    if (std::getenv("MC_EP_COMBINE_RECV_THREADS") == nullptr) {
        EXPECT_EQ(epCombineReceiveThreads(g, false), kEpCombineRecvMaxThreads);
        // Split, the copy kernel has a block per token and nothing spins.
        EXPECT_EQ(epCombineReceiveThreads(g, true), kEpCombineRecvMinThreads);
        g.ranks_per_device = 1;
        EXPECT_EQ(epCombineReceiveThreads(g, false), kEpCombineRecvMinThreads);
    }
    g.num_ranks = 2;
    g.num_experts = validGroup().num_experts;
    g.ranks_per_device = 3;
    expectInvalid(checkGroupArgs(g), "ranks_per_device is 3, expected in [1, 2]");
    g.ranks_per_device = 0;
    expectInvalid(checkGroupArgs(g), "ranks_per_device is 0, expected in [1, 2]");
}

TEST(EpReference, QuantizerFollowsTheRule) {
    // One group: amax 3.5 -> scale 3.5 / 448, 3.5 maps to 448 (E4M3 0x7e), 0 to 0.
    std::vector<uint16_t> row(128, test::bf16Bits(0.0f));
    row[5] = test::bf16Bits(-3.5f);
    row[6] = test::bf16Bits(3.5f);
    row[7] = test::bf16Bits(1.75f);
    std::vector<uint8_t> q(128);
    float scale = 0;
    test::quantizeRow(row.data(), 128, q.data(), &scale);
    EXPECT_EQ(scale, 3.5f / 448.0f);
    EXPECT_EQ(q[6], 0x7e);
    EXPECT_EQ(q[5], 0xfe);
    EXPECT_EQ(q[7], 0x76);  // 224 = 1.75 * 2^7
    EXPECT_EQ(q[0], 0x00);
    // An all-zero group uses the amax floor.
    std::vector<uint16_t> zeros(128, test::bf16Bits(0.0f));
    test::quantizeRow(zeros.data(), 128, q.data(), &scale);
    EXPECT_EQ(scale, kEpFp8AmaxFloor / 448.0f);
}

}  // namespace
}  // namespace mooncake::ep
