// The IBGDA signal words' shadow protocol (ibgda_kernels.h, ibgdaSignalPut)
// on the host against the software HCA: a sender raises a receiver's two
// phase words with fetch-adds computed from what it added before, and after
// every operation the word of that phase must read exactly
// epMakeSignal(seq, count), the other phase's word untouched, as the
// receive kernels' epWaitSignal expects. Counts go up and down (negative
// differences wrap modulo 2^64) and the sequence crosses 2^32 (only its low
// 32 bits travel). Runs everywhere.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "mooncake-ep/core/signal_word.h"
#include "mooncake-ep/ibgda/ibgda_kernels.h"
#include "tests/cpp/rdma/soft_hca.h"

namespace mooncake::ep {
namespace {

using te::rdma::soft::SoftHca;

constexpr auto nowNs = te::rdma::soft::steadyNowNs;

TEST(IbgdaSignal, WordsEndAtEachOpsSequenceAndCountThroughFetchAdds) {
    SoftHca hca;
    // The receiver's buffer: its two phase words at offsets 64 and 72, data after.
    alignas(64) static uint64_t receiver[64];
    alignas(64) static unsigned char staging[4096];
    const uint32_t rkey = hca.registerMemory(receiver, sizeof(receiver));
    const uint32_t lkey = hca.registerMemory(staging, sizeof(staging));
    const int qp = hca.createQueuePair(16, 16);
    IbgdaChannel ch;
    ch.sq = hca.sendQueue(qp);
    ch.cq = hca.completionQueue(qp);
    const uint64_t base = reinterpret_cast<uint64_t>(receiver);
    const uint32_t keys[2] = {0, rkey};
    const uint64_t bases[2] = {0, base};
    IbgdaEpDevice d;
    d.remote_bases = bases;
    d.rkeys = keys;
    d.staging = reinterpret_cast<char*>(staging);
    d.staging_lkey = lkey;
    hca.start();
    uint64_t shadow[2] = {0, 0};
    uint64_t expected[2] = {0, 0};
    const uint64_t first = (uint64_t{1} << 32) - 60;  // crosses 2^32
    for (uint64_t seq = first; seq < first + 120; ++seq) {
        const int phase = static_cast<int>(seq & 1);
        // Up and down, zero included.
        const auto count = static_cast<uint32_t>((seq * 2654435761u) % 300);
        const uint64_t value = epMakeSignal(seq, count);
        const int64_t word = 64 + 8 * phase;
        // A count-only put for even sequences; odd ones carry 32 bytes of data.
        const int64_t length = (seq & 1) ? 32 : 0;
        const mlx5q::PutWithCount p =
            ibgdaSignalPut(d, 1, reinterpret_cast<uint64_t>(staging + 256), 256, length, word,
                           shadow[phase], value);
        const int64_t deadline = nowNs() + 5'000'000'000;
        ASSERT_EQ(IbgdaStatus::kOk, ibgdaPutWithCount(&ch, p, deadline, nowNs)) << seq;
        shadow[phase] = value;
        ASSERT_EQ(IbgdaStatus::kOk, ibgdaQuiet(&ch, deadline, nowNs)) << seq;
        expected[phase] = value;
        const uint64_t got = receiver[8 + phase];
        ASSERT_EQ(expected[phase], got) << "seq " << seq;
        ASSERT_TRUE(epSignalMatches(got, seq));
        ASSERT_EQ(count, epSignalPayload(got));
        ASSERT_FALSE(epSignalMatches(receiver[8 + (1 - phase)], seq)) << "the other phase";
        ASSERT_EQ(expected[1 - phase], receiver[8 + (1 - phase)]) << "untouched";
    }
    hca.stop();
    EXPECT_EQ("", hca.violation());
}

}  // namespace
}  // namespace mooncake::ep
