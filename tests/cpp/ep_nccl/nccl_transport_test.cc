// Host-side checks of the NCCL device-API transport: bad options are refused
// before any NCCL or CUDA call, the window and signal sizes follow the EP
// layout, the versions are the headers' and the loaded library's, and a
// setup whose peer never comes ends with an error within its deadline.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <array>
#include <string>

#include "mooncake-ep/nccl/nccl_device_args.h"
#include "mooncake-ep/nccl/nccl_transport.h"

namespace mooncake::ep {
namespace {

NcclEpOptions validOptions() {
    NcclEpOptions o;
    o.rank = 0;
    o.num_ranks = 2;
    o.device = 0;
    o.num_experts = 4;
    o.max_tokens = 8;
    o.hidden = 256;
    o.timeout_ms = 2000;
    return o;
}

TEST(EpNccl, VersionsAreTheHeadersAndTheLoadedLibrary) {
    EXPECT_EQ(ncclEpBuiltVersion(), NCCL_VERSION_CODE);
    EXPECT_GE(ncclEpBuiltVersion(), 22809) << "CMake's NCCL floor (cmake/NcclDevice.cmake)";
    EXPECT_EQ(ncclEpRuntimeVersion(), NCCL_VERSION_CODE)
        << "the test links the libnccl of the headers it was built with";
}

TEST(EpNccl, WindowIsTheLayoutPlusTheStaging) {
    // 2 ranks, 4 experts, 8 tokens, hidden 256: signals 8 * (2 * 2 + 4) = 64 -> 256 bytes;
    // dispatch region 4 * 8 * (128 + 512) = 20480; combine region 4 * 8 * 512 = 16384.
    const int64_t half = 256 + 20480 + 16384;
    EXPECT_EQ(ncclEpWindowBytes(2, 4, 8, 256), 256 + 2 * half + 20480 + 16384);
    // One GIN signal per signal word: 2 local experts x 2 sources + 4 combine flags.
    EXPECT_EQ(ncclEpSignalCount(2, 4), 8);
    EXPECT_EQ(ncclEpSignalCount(8, 256), 32 * 8 + 256);
}

TEST(EpNccl, BadOptionsNameTheValue) {
    std::unique_ptr<NcclEpTransport> t;
    NcclEpOptions o = validOptions();
    o.rank = 3;
    Status st = NcclEpTransport::create(o, &t);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("rank 3 of 2, expected 0 <= rank < num_ranks"), std::string::npos)
        << st.message();
    o = validOptions();
    o.num_experts = 3;
    st = NcclEpTransport::create(o, &t);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("num_experts 3"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("a positive multiple of num_ranks"), std::string::npos);
    o = validOptions();
    o.hidden = 100;
    st = NcclEpTransport::create(o, &t);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("hidden 100"), std::string::npos) << st.message();
    EXPECT_TRUE(t == nullptr);
}

TEST(EpNccl, UniqueIdsAreFresh) {
    std::array<char, kNcclUniqueIdBytes> a{}, b{};
    ASSERT_TRUE(ncclEpUniqueId(&a).ok());
    ASSERT_TRUE(ncclEpUniqueId(&b).ok());
    EXPECT_NE(a, b);
}

// Rank 0 of 2 whose peer never joins: an error within the deadline, not a
// hang. Without a GPU the setup stops at the device, also with an error.
TEST(EpNccl, SetupWithoutItsPeerEndsInTime) {
    std::unique_ptr<NcclEpTransport> t;
    NcclEpOptions o = validOptions();
    ASSERT_TRUE(ncclEpUniqueId(&o.unique_id).ok());
    int devices = 0;
    const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
    // A hang fails through the ctest timeout; no time is asserted here.
    Status st = NcclEpTransport::create(o, &t);
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(t == nullptr);
    if (gpu) {
        EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.message();
        EXPECT_NE(st.message().find("ncclCommInitRankConfig"), std::string::npos) << st.message();
    } else {
        EXPECT_NE(st.message().find("cudaSetDevice"), std::string::npos) << st.message();
    }
}

}  // namespace
}  // namespace mooncake::ep
