// The host-side policy of the device collectives (routing.h), no GPU needed:
// the MC_PG_CUDA_PATH, MC_PG_CUDA_SLOT_BYTES and MC_PG_CUDA_BLOCKING_WAIT settings, the routing
// decision table, the window arithmetic, how a kernel's result word
// becomes the op's Status and failed-ranks hint, and the host evidence that
// goes into the abort word.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/broadcast.h"
#include "mooncake-pg/device/routing.h"

namespace mooncake::pg::device {
namespace {

TEST(DeviceRouting, PathSettingDefaultsToKernelsAndNamesBadValues) {
    ASSERT_TRUE(parseCudaPath(nullptr).ok());
    EXPECT_EQ(parseCudaPath(nullptr).value(), CudaPath::kKernels);
    EXPECT_EQ(parseCudaPath("").value(), CudaPath::kKernels);
    EXPECT_EQ(parseCudaPath("staged").value(), CudaPath::kStaged);
    EXPECT_EQ(parseCudaPath("kernels").value(), CudaPath::kKernels);
    for (const char* bad : {"kernel", "KERNELS", "nccl", " staged"}) {
        auto r = parseCudaPath(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        const std::string msg = r.status().message();
        EXPECT_NE(msg.find("MC_PG_CUDA_PATH='" + std::string(bad) + "'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("'staged'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("'kernels'"), std::string::npos) << msg;
    }
    EXPECT_STREQ(cudaPathName(CudaPath::kKernels), "kernels");
    EXPECT_STREQ(cudaPathName(CudaPath::kStaged), "staged");
}

TEST(DeviceRouting, SlotBytesSetting) {
    EXPECT_EQ(parseSlotBytes(nullptr).value(), uint64_t{1} << 20);
    EXPECT_EQ(parseSlotBytes("").value(), uint64_t{1} << 20);
    EXPECT_EQ(parseSlotBytes("512").value(), 512u);
    EXPECT_EQ(parseSlotBytes("1073741824").value(), uint64_t{1} << 30);
    for (const char* bad : {"0", "24", "-16", "1k", "abc", "1073741840", "99999999999999999999"}) {
        auto r = parseSlotBytes(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("MC_PG_CUDA_SLOT_BYTES='" + std::string(bad) + "'"),
                  std::string::npos)
            << r.status().message();
        EXPECT_NE(r.status().message().find("multiple of 16"), std::string::npos);
    }
}

TEST(DeviceRouting, P2PPoolBytesSetting) {
    EXPECT_EQ(parseP2PPoolBytes(nullptr).value(), uint64_t{16} << 20);
    EXPECT_EQ(parseP2PPoolBytes("").value(), uint64_t{16} << 20);
    EXPECT_EQ(parseP2PPoolBytes("4096").value(), 4096u);
    EXPECT_EQ(parseP2PPoolBytes("1073741824").value(), uint64_t{1} << 30);
    for (const char* bad : {"0", "4000", "-4096", "4k", "1073745920", "99999999999999999999"}) {
        auto r = parseP2PPoolBytes(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("MC_PG_CUDA_P2P_POOL_BYTES='" + std::string(bad) + "'"),
                  std::string::npos)
            << r.status().message();
        EXPECT_NE(r.status().message().find("multiple of 4096"), std::string::npos);
    }
    // Chunks: the whole pool while it is small, else 4 MiB (four in flight
    // with the default pool).
    EXPECT_EQ(p2pChunkBytes(4096), 4096u);
    EXPECT_EQ(p2pChunkBytes(uint64_t{16} << 20), uint64_t{4} << 20);
}

TEST(DeviceRouting, P2PCopySettingDefaultsToMemcpyAndNamesBadValues) {
    EXPECT_FALSE(parseP2PCopyWithKernel(nullptr).value());
    EXPECT_FALSE(parseP2PCopyWithKernel("").value());
    EXPECT_FALSE(parseP2PCopyWithKernel("memcpy").value());
    EXPECT_TRUE(parseP2PCopyWithKernel("kernel").value());
    for (const char* bad : {"Kernel", "1", "sm"}) {
        auto r = parseP2PCopyWithKernel(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("MC_PG_CUDA_P2P_COPY='" + std::string(bad) +
                                            "' is not a setting; expected 'memcpy'"),
                  std::string::npos)
            << r.status().message();
    }
}

TEST(DeviceRouting, DirectSettingDefaultsToOnAndNamesBadValues) {
    EXPECT_TRUE(parseDirect(nullptr).value());
    EXPECT_TRUE(parseDirect("").value());
    EXPECT_TRUE(parseDirect("1").value());
    EXPECT_FALSE(parseDirect("0").value());
    auto bad = parseDirect("yes");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("MC_PG_CUDA_DIRECT='yes'"), std::string::npos)
        << bad.status().message();
}

TEST(DeviceRouting, CallerLaunchSettingDefaultsToOnAndNamesBadValues) {
    EXPECT_TRUE(parseCallerLaunch(nullptr).value());
    EXPECT_TRUE(parseCallerLaunch("").value());
    EXPECT_TRUE(parseCallerLaunch("1").value());
    EXPECT_FALSE(parseCallerLaunch("0").value());
    auto bad = parseCallerLaunch("on");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("MC_PG_CUDA_CALLER_LAUNCH='on' is not a setting"),
              std::string::npos)
        << bad.status().message();
}

TEST(DeviceRouting, BlockingWaitSettingDefaultsToOffAndNamesBadValues) {
    EXPECT_FALSE(parseBlockingWait(nullptr).value());
    EXPECT_FALSE(parseBlockingWait("").value());
    EXPECT_FALSE(parseBlockingWait("0").value());
    EXPECT_TRUE(parseBlockingWait("1").value());
    for (const char* bad : {"true", "yes", "2", " 1", "01"}) {
        auto r = parseBlockingWait(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(r.status().message().find("MC_PG_CUDA_BLOCKING_WAIT='" + std::string(bad) + "'"),
                  std::string::npos)
            << r.status().message();
        EXPECT_NE(r.status().message().find("'0'"), std::string::npos);
        EXPECT_NE(r.status().message().find("'1'"), std::string::npos);
    }
}

TEST(DeviceRouting, WindowBytesPerRank) {
    // 4 KiB of flags and signatures, then two parities of one slot per
    // source the group may hold.
    EXPECT_EQ(groupWindowBytes(2, 1 << 20).value(), 4096u + 2u * 2u * (1u << 20));
    EXPECT_EQ(groupWindowBytes(8, 1 << 20).value(), 4096u + 16u * (1u << 20));
    EXPECT_EQ(groupWindowBytes(64, 512).value(), 4096u + 128u * 512u);
    EXPECT_EQ(groupWindowBytes(1, 16).value(), 4096u + 32u);
    EXPECT_FALSE(groupWindowBytes(0, 1 << 20).ok());
    EXPECT_FALSE(groupWindowBytes(65, 1 << 20).ok());
    EXPECT_FALSE(groupWindowBytes(4, 24).ok());
    EXPECT_FALSE(groupWindowBytes(4, 0).ok());
    EXPECT_NE(groupWindowBytes(65, 1 << 20).status().message().find("max_group_size=65"),
              std::string::npos);
}

RouteQuery query(CudaCollective c, DataType dtype = DataType::kFloat32,
                 ReduceOp op = ReduceOp::kSum, uint64_t count = 1024, int size = 4) {
    RouteQuery q;
    q.collective = c;
    q.dtype = dtype;
    q.op = op;
    q.count = count;
    q.group_size = size;
    return q;
}

TEST(DeviceRouting, DecisionTable) {
    using C = CudaCollective;
    const C kernels[] = {C::kAllReduce, C::kAllGather, C::kReduceScatter,
                         C::kAllToAll,  C::kAllToAllV, C::kBroadcast,
                         C::kReduce,    C::kGather,    C::kScatter};
    std::string why;
    for (C c : kernels) {
        EXPECT_EQ(routeFor(CudaPath::kKernels, query(c), &why), CudaRoute::kKernel)
            << cudaCollectiveName(c) << ": " << why;
        EXPECT_TRUE(why.empty());
        // The setting wins over everything.
        EXPECT_EQ(routeFor(CudaPath::kStaged, query(c), &why), CudaRoute::kHostStaging);
        EXPECT_NE(why.find("MC_PG_CUDA_PATH"), std::string::npos) << why;
        // Sizes the kernels do not take.
        EXPECT_EQ(routeFor(CudaPath::kKernels, query(c, DataType::kFloat32, ReduceOp::kSum, 0)),
                  CudaRoute::kHostStaging);
        EXPECT_EQ(routeFor(CudaPath::kKernels,
                           query(c, DataType::kFloat32, ReduceOp::kSum, uint64_t{1} << 40)),
                  CudaRoute::kHostStaging);
        for (int size : {0, 1, 65}) {
            EXPECT_EQ(routeFor(CudaPath::kKernels,
                               query(c, DataType::kFloat32, ReduceOp::kSum, 1024, size), &why),
                      CudaRoute::kHostStaging)
                << size;
            EXPECT_NE(why.find("ranks"), std::string::npos) << why;
        }
        EXPECT_EQ(routeFor(CudaPath::kKernels, query(c, DataType::kFloat32, ReduceOp::kSum,
                                                     (uint64_t{1} << 40) - 1, 64)),
                  CudaRoute::kKernel);
        EXPECT_EQ(routeFor(CudaPath::kKernels, query(c, DataType::kFloat32, ReduceOp::kSum, 1, 2)),
                  CudaRoute::kKernel);
    }
}

TEST(DeviceRouting, ReductionsFollowTheOpAndDtype) {
    using C = CudaCollective;
    for (C c : {C::kAllReduce, C::kReduceScatter, C::kReduce}) {
        // Every op the core defines for the dtype has a kernel.
        for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16, DataType::kInt8, DataType::kUInt8, DataType::kInt16,
                           DataType::kInt32, DataType::kInt64, DataType::kBool}) {
            for (int o = 0; o <= static_cast<int>(ReduceOp::kBxor); ++o) {
                const auto op = static_cast<ReduceOp>(o);
                const bool defined = reduceOpSupported(op, t, nullptr);
                EXPECT_EQ(routeFor(CudaPath::kKernels, query(c, t, op)),
                          defined ? CudaRoute::kKernel : CudaRoute::kHostStaging)
                    << dataTypeName(t) << " " << reduceOpName(op);
            }
        }
    }
    // Data movers ignore the op: a bitwise op on floats does not matter.
    EXPECT_EQ(routeFor(CudaPath::kKernels,
                       query(CudaCollective::kAllGather, DataType::kFloat32, ReduceOp::kBxor)),
              CudaRoute::kKernel);
    EXPECT_EQ(routeFor(CudaPath::kKernels, query(CudaCollective::kBroadcast, DataType::kBool)),
              CudaRoute::kKernel);
}

DeviceOpResult result(DeviceStatus s, int culprit, uint64_t detail) {
    DeviceOpResult r;
    r.status = static_cast<int32_t>(s);
    r.culprit = culprit;
    r.detail = detail;
    return r;
}

TEST(DeviceRouting, ResultBecomesStatusAndHint) {
    std::vector<int> failed{9};
    EXPECT_TRUE(resultStatus(result(DeviceStatus::kOk, -1, 0), "all_reduce", &failed).ok());
    EXPECT_TRUE(failed.empty());

    Status st = resultStatus(result(DeviceStatus::kTimeout, 2, 0), "all_reduce", &failed);
    EXPECT_EQ(st.code(), StatusCode::kTimeout);
    EXPECT_NE(st.message().find("waiting for rank 2"), std::string::npos) << st.toString();
    EXPECT_EQ(failed, std::vector<int>{2});

    EXPECT_NE(st.message().find("(no signal from it yet)"), std::string::npos) << st.toString();
    // The detail is the peer's last flag: how far it got.
    st = resultStatus(result(DeviceStatus::kTimeout, 1, stepTag(2, 5, 3)), "all_reduce", &failed);
    EXPECT_NE(st.message().find("waiting for rank 1 on the device (its last signal: call 5 step 3 "
                                "of epoch 2)"),
              std::string::npos)
        << st.toString();
    EXPECT_EQ(failed, std::vector<int>{1});

    st = resultStatus(result(DeviceStatus::kTimeout, -1, 0), "all_reduce", &failed);
    EXPECT_EQ(st.code(), StatusCode::kTimeout);
    EXPECT_TRUE(failed.empty());

    // The host's abort reasons: a dead peer names it, whoever the kernel
    // was waiting on.
    st = resultStatus(result(DeviceStatus::kAborted, 1, abortPeerDead(3)), "all_gather", &failed);
    EXPECT_EQ(st.code(), StatusCode::kPeerFailure);
    EXPECT_NE(st.message().find("rank 3 failed"), std::string::npos) << st.toString();
    EXPECT_EQ(failed, std::vector<int>{3});
    st = resultStatus(result(DeviceStatus::kAborted, 1, abortPeerDead(0)), "all_gather", &failed);
    EXPECT_EQ(failed, std::vector<int>{0});

    st = resultStatus(result(DeviceStatus::kAborted, 1, kAbortGroupAborted), "broadcast", &failed);
    EXPECT_EQ(st.code(), StatusCode::kAborted);
    EXPECT_NE(st.message().find("aborted"), std::string::npos) << st.toString();
    EXPECT_TRUE(failed.empty());
    // A member the host saw leave the view is named, as a dead one is.
    st =
        resultStatus(result(DeviceStatus::kAborted, 0, abortDeactivated(2)), "all_reduce", &failed);
    EXPECT_EQ(st.code(), StatusCode::kPeerFailure);
    EXPECT_NE(st.message().find("rank 2 was deactivated"), std::string::npos) << st.toString();
    EXPECT_EQ(failed, std::vector<int>{2});
    // The host's deadline is a timeout blaming the peer the kernel waited on
    // (evidence, as the kernel's own timeout is), not an abort of the group.
    st = resultStatus(result(DeviceStatus::kAborted, 2, kAbortDeadline), "all_reduce", &failed);
    EXPECT_EQ(st.code(), StatusCode::kTimeout);
    EXPECT_NE(st.message().find("waiting for rank 2"), std::string::npos) << st.toString();
    EXPECT_EQ(failed, std::vector<int>{2});
    st = resultStatus(result(DeviceStatus::kAborted, -1, kAbortDeadline), "all_reduce", &failed);
    EXPECT_EQ(st.code(), StatusCode::kTimeout);
    EXPECT_TRUE(failed.empty());

    // A mismatch names the peer and its call, and is no evidence against it.
    const uint64_t sig = callSignature(1, static_cast<uint8_t>(DataType::kBFloat16),
                                       static_cast<uint8_t>(ReduceOp::kMax), 77);
    st = resultStatus(result(DeviceStatus::kMismatch, 1, sig), "all_reduce", &failed);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("rank 1 passed all_reduce of dtype bfloat16, op max, count 77"),
              std::string::npos)
        << st.toString();
    EXPECT_TRUE(failed.empty());
    const uint64_t bsig = callSignature(5, static_cast<uint8_t>(DataType::kInt32), 3, 5);
    st = resultStatus(result(DeviceStatus::kMismatch, 0, bsig), "broadcast", &failed);
    EXPECT_NE(st.message().find("broadcast of dtype int32, root 3, count 5"), std::string::npos)
        << st.toString();

    // gather and scatter carry their root where broadcast does.
    for (auto [id, name] :
         {std::pair{kGatherCollective, "gather"}, std::pair{kScatterCollective, "scatter"}}) {
        const uint64_t gsig = callSignature(id, static_cast<uint8_t>(DataType::kInt64), 2, 6);
        st = resultStatus(result(DeviceStatus::kMismatch, 1, gsig), name, &failed);
        EXPECT_NE(st.message().find(std::string("rank 1 passed ") + name +
                                    " of dtype int64, root 2, count 6"),
                  std::string::npos)
            << st.toString();
    }

    // A reduce is an all_reduce signed with its root; the direct path's ids
    // read as their collective.
    const uint64_t rsig =
        callSignature(reductionCollective(false, 2), static_cast<uint8_t>(DataType::kFloat32),
                      static_cast<uint8_t>(ReduceOp::kSum), 9);
    st = resultStatus(result(DeviceStatus::kMismatch, 3, rsig), "reduce", &failed);
    EXPECT_NE(st.message().find("rank 3 passed reduce to root 2 of dtype float32, op sum, count 9"),
              std::string::npos)
        << st.toString();
    const uint64_t drsig =
        callSignature(reductionCollective(true, 63), static_cast<uint8_t>(DataType::kFloat32),
                      static_cast<uint8_t>(ReduceOp::kMax), 9);
    st = resultStatus(result(DeviceStatus::kMismatch, 3, drsig), "reduce", &failed);
    EXPECT_NE(st.message().find("reduce to root 63 of dtype float32, op max"), std::string::npos)
        << st.toString();
    const uint64_t dsig =
        callSignature(reductionCollective(true, -1), static_cast<uint8_t>(DataType::kFloat32),
                      static_cast<uint8_t>(ReduceOp::kSum), 9);
    st = resultStatus(result(DeviceStatus::kMismatch, 3, dsig), "all_reduce", &failed);
    EXPECT_NE(st.message().find("passed all_reduce of dtype float32, op sum, count 9"),
              std::string::npos)
        << st.toString();
    // Every root has its own id, apart from the all_reduce's and the other path's.
    EXPECT_NE(reductionCollective(false, 0), reductionCollective(false, -1));
    EXPECT_NE(reductionCollective(false, 0), reductionCollective(false, 1));
    EXPECT_NE(reductionCollective(false, 5), reductionCollective(true, 5));

    st = resultStatus(result(DeviceStatus::kStaleEpoch, -1, 0), "all_to_all", &failed);
    EXPECT_EQ(st.code(), StatusCode::kAborted);
    EXPECT_NE(st.message().find("epoch"), std::string::npos);

    st = resultStatus(result(static_cast<DeviceStatus>(42), -1, 0), "all_to_all", &failed);
    EXPECT_EQ(st.code(), StatusCode::kInternal);
}

// A failed graph replay is reported to the control plane only when it says
// something about a peer the control plane does not know yet.
TEST(DeviceRouting, OnlyTimeoutsAndDeadPeersAreFailureEvidence) {
    EXPECT_FALSE(isFailureEvidence(result(DeviceStatus::kOk, -1, 0)));
    EXPECT_TRUE(isFailureEvidence(result(DeviceStatus::kTimeout, 1, 0)));
    EXPECT_TRUE(isFailureEvidence(result(DeviceStatus::kTimeout, -1, 0)));
    EXPECT_TRUE(isFailureEvidence(result(DeviceStatus::kAborted, 1, abortPeerDead(2))));
    EXPECT_TRUE(isFailureEvidence(result(DeviceStatus::kAborted, 0, abortPeerDead(0))));
    EXPECT_TRUE(isFailureEvidence(result(DeviceStatus::kAborted, 2, kAbortDeadline)));
    // The control plane's own decision, the user's abort, a stale graph and
    // disagreeing calls say nothing new about a peer's health.
    EXPECT_FALSE(isFailureEvidence(result(DeviceStatus::kAborted, 1, abortDeactivated(2))));
    EXPECT_FALSE(isFailureEvidence(result(DeviceStatus::kAborted, -1, kAbortGroupAborted)));
    EXPECT_FALSE(isFailureEvidence(result(DeviceStatus::kStaleEpoch, -1, 0)));
    EXPECT_FALSE(isFailureEvidence(result(DeviceStatus::kMismatch, 1, 0)));
}

TEST(DeviceRouting, AbortReasonNamesTheFirstDeadPeerThenTheFirstMemberGone) {
    const auto none = [](int) { return false; };
    const auto dead = [](std::vector<int> ranks) {
        return [ranks](int p) {
            for (int r : ranks)
                if (r == p)
                    return true;
            return false;
        };
    };
    const auto active_but = [](int gone) { return [gone](int p) { return p != gone; }; };

    EXPECT_EQ(abortReasonFor(0, 4, none, nullptr), 0u);
    EXPECT_EQ(abortReasonFor(0, 4, none, active_but(-1)), 0u);
    EXPECT_EQ(abortReasonFor(0, 4, dead({2}), nullptr), abortPeerDead(2));
    EXPECT_EQ(abortReasonFor(0, 4, dead({3, 1}), nullptr), abortPeerDead(1));
    // This rank's own record is not evidence against it; ranks at or past
    // the call's size are not its members.
    EXPECT_EQ(abortReasonFor(1, 4, dead({1}), nullptr), 0u);
    EXPECT_EQ(abortReasonFor(0, 2, dead({2, 3}), nullptr), 0u);
    // A member a newer view took out, when nobody is dead.
    EXPECT_EQ(abortReasonFor(0, 4, none, active_but(3)), abortDeactivated(3));
    EXPECT_EQ(abortReasonFor(0, 4, dead({1}), active_but(3)), abortPeerDead(1));
    EXPECT_EQ(abortReasonFor(0, 3, none, active_but(3)), 0u);
    // This rank taken out of the view is a reason too: its call cannot complete.
    EXPECT_EQ(abortReasonFor(2, 4, none, active_but(2)), abortDeactivated(2));
}

}  // namespace
}  // namespace mooncake::pg::device
