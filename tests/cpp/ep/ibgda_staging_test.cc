// Host-only checks of the IBGDA send kernels' arguments (ibgda_kernels.h):
// the staging layout (blocks disjoint, 16-byte aligned, inside the staging
// that the Buffer allocates for its size) and the launch checks, which fail
// before any CUDA call. The kernels themselves need a GPU and a NIC.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "mooncake-ep/ibgda/ibgda_kernels.h"

namespace mooncake::ep {
namespace {

// Every shape of the sweep: (num_ranks, num_experts, max_tokens, hidden).
template <typename F>
void forEachShape(F f) {
    for (int64_t r : {1, 2, 3, 8, 16}) {
        for (int64_t per_rank : {1, 2, 32}) {
            for (int64_t m : {1, 7, 128}) {
                for (int64_t h : {128, 1024, 7168})
                    f(EpLayout{r, r * per_rank, m, h});
            }
        }
    }
}

TEST(IbgdaStaging, EveryLayoutFitsTheStagingItsBufferSizeGets) {
    forEachShape([](const EpLayout& L) {
        const int64_t buffer = L.totalBytes();
        const IbgdaStagingLayout S{L};
        EXPECT_LE(S.totalBytes(), ibgdaStagingBytesFor(buffer))
            << L.num_ranks << " ranks, " << L.num_experts << " experts, " << L.max_tokens
            << " tokens, hidden " << L.hidden;
        // Not wastefully more: the staging stays close to one buffer half.
        EXPECT_LE(ibgdaStagingBytesFor(buffer), buffer * 6 / 10 + 1024);
    });
}

TEST(IbgdaStaging, BlocksAreDisjointAlignedAndInOrder) {
    forEachShape([](const EpLayout& L) {
        const IbgdaStagingLayout S{L};
        int64_t end = kIbgdaScratchBytes;  // the fetch-add results come first
        for (int64_t e = 0; e < L.num_experts; ++e) {
            ASSERT_EQ(S.dispatchBlockOffset(e), end);
            ASSERT_EQ(0, S.dispatchBlockOffset(e) % 16);
            end += kIbgdaShadowBytes + L.max_tokens * L.messageBytes();
        }
        for (int64_t le = 0; le < L.numLocalExperts(); ++le) {
            for (int64_t dst = 0; dst < L.num_ranks; ++dst) {
                ASSERT_EQ(S.combineBlockOffset(le, dst), end);
                ASSERT_EQ(0, S.combineBlockOffset(le, dst) % 16);
                end += kIbgdaShadowBytes + L.max_tokens * L.hidden * 2;
            }
        }
        EXPECT_EQ(S.totalBytes(), end);
    });
}

struct Fixture {
    Fixture() {
        g.rank = 1;
        g.num_ranks = 4;
        g.num_experts = 8;
        g.max_tokens = 16;
        g.hidden = 256;
        g.local_buffer = &fake;
        g.local_buffer_bytes = static_cast<uint64_t>(epLayoutOf(g).totalBytes());
        g.peer_buffers = reinterpret_cast<void* const*>(&fake);
        g.active_ranks = reinterpret_cast<int32_t*>(&fake);
        d.channels = reinterpret_cast<IbgdaChannel*>(&fake);
        d.qps_per_rank = 2;
        d.remote_bases = reinterpret_cast<const uint64_t*>(&fake);
        d.rkeys = reinterpret_cast<const uint32_t*>(&fake);
        d.staging = reinterpret_cast<char*>(&fake);
        d.staging_bytes = static_cast<uint64_t>(IbgdaStagingLayout{epLayoutOf(g)}.totalBytes());
    }
    EpGroupArgs g;
    IbgdaEpDevice d;
    int64_t fake = 0;  // never dereferenced: the checks only look at pointers
};

std::string messageOf(const Status& st) {
    return st.ok() ? "OK" : st.message();
}

TEST(IbgdaStaging, LaunchChecksNameWhatIsWrong) {
    Fixture f;
    EXPECT_TRUE(checkIbgdaArgs(f.d, f.g).ok()) << messageOf(checkIbgdaArgs(f.d, f.g));
    {
        Fixture x;
        x.d.staging_bytes -= 1;
        const std::string m = messageOf(checkIbgdaArgs(x.d, x.g));
        EXPECT_NE(std::string::npos,
                  m.find("the staging holds " + std::to_string(x.d.staging_bytes)))
            << m;
        EXPECT_NE(std::string::npos, m.find("num_experts=8")) << m;
    }
    {
        Fixture x;
        x.d.qps_per_rank = 0;
        EXPECT_NE(std::string::npos, messageOf(checkIbgdaArgs(x.d, x.g)).find("qps_per_rank=0"));
    }
    {
        Fixture x;
        x.d.rkeys = nullptr;
        EXPECT_NE(std::string::npos,
                  messageOf(checkIbgdaArgs(x.d, x.g)).find("device tables are not set up"));
    }
    {
        // One dispatch block's messages would not fit one WRITE.
        Fixture x;
        x.g.max_tokens = 150000;
        x.g.hidden = 7168;
        x.g.local_buffer_bytes = static_cast<uint64_t>(epLayoutOf(x.g).totalBytes());
        x.d.staging_bytes = static_cast<uint64_t>(IbgdaStagingLayout{epLayoutOf(x.g)}.totalBytes());
        const std::string m = messageOf(checkIbgdaArgs(x.d, x.g));
        EXPECT_NE(std::string::npos, m.find("expected below 2^31")) << m;
    }
    {
        // The group's own checks come first.
        Fixture x;
        x.g.hidden = 100;
        EXPECT_NE(std::string::npos, messageOf(checkIbgdaArgs(x.d, x.g)).find("hidden is 100"));
    }
}

}  // namespace
}  // namespace mooncake::ep
