// Error mapping: every verbs failure becomes a Status that names the call,
// the errno (symbol and text) and what it was for, with a code the caller can
// act on; every work-completion status likewise. And a verbs library that is
// missing or incomplete is reported, not fatal.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma {
namespace {

TEST(VerbsError, NamesTheCallErrnoAndPurpose) {
    Status st = verbsError("ibv_reg_mr", ENOMEM, "4096 bytes of host memory on mlx5_0");
    EXPECT_EQ(st.code(), StatusCode::kUnavailable);
    EXPECT_NE(st.message().find("ibv_reg_mr failed: ENOMEM"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(std::strerror(ENOMEM)), std::string::npos);
    EXPECT_NE(st.message().find("for 4096 bytes of host memory on mlx5_0"), std::string::npos);
    EXPECT_NE(st.message().find("ulimit -l"), std::string::npos);
}

TEST(VerbsError, EveryErrnoClass) {
    const struct {
        int err;
        StatusCode code;
        const char* name;
    } table[] = {
        {EINVAL, StatusCode::kInvalidArgument, "EINVAL"},
        {EFAULT, StatusCode::kInvalidArgument, "EFAULT"},
        {EBADF, StatusCode::kInvalidArgument, "EBADF"},
        {ERANGE, StatusCode::kInvalidArgument, "ERANGE"},
        {EPERM, StatusCode::kPermissionDenied, "EPERM"},
        {EACCES, StatusCode::kPermissionDenied, "EACCES"},
        {ENODEV, StatusCode::kUnavailable, "ENODEV"},
        {ENXIO, StatusCode::kUnavailable, "ENXIO"},
        {ENOENT, StatusCode::kUnavailable, "ENOENT"},
        {ENOSYS, StatusCode::kUnavailable, "ENOSYS"},
        {EOPNOTSUPP, StatusCode::kUnavailable, "EOPNOTSUPP"},
        {EPROTONOSUPPORT, StatusCode::kUnavailable, "EPROTONOSUPPORT"},
        {ENOMEM, StatusCode::kUnavailable, "ENOMEM"},
        {ENOSPC, StatusCode::kUnavailable, "ENOSPC"},
        {EMFILE, StatusCode::kUnavailable, "EMFILE"},
        {ENFILE, StatusCode::kUnavailable, "ENFILE"},
        {EAGAIN, StatusCode::kUnavailable, "EAGAIN"},
        {EBUSY, StatusCode::kUnavailable, "EBUSY"},
        {ETIMEDOUT, StatusCode::kTimeout, "ETIMEDOUT"},
        {ENETDOWN, StatusCode::kPeerFailure, "ENETDOWN"},
        {ENETUNREACH, StatusCode::kPeerFailure, "ENETUNREACH"},
        {EHOSTUNREACH, StatusCode::kPeerFailure, "EHOSTUNREACH"},
        {ECONNRESET, StatusCode::kPeerFailure, "ECONNRESET"},
        {ECONNREFUSED, StatusCode::kPeerFailure, "ECONNREFUSED"},
        {EIO, StatusCode::kPeerFailure, "EIO"},
        {EEXIST, StatusCode::kInternal, "EEXIST"},
        {EINTR, StatusCode::kInternal, "EINTR"},
    };
    for (const auto& row : table) {
        Status st = verbsError("ibv_modify_qp(INIT->RTR)", row.err);
        EXPECT_EQ(st.code(), row.code) << row.name;
        EXPECT_EQ(
            st.message().rfind(std::string("ibv_modify_qp(INIT->RTR) failed: ") + row.name, 0), 0u)
            << st.message();
    }
    EXPECT_EQ(errnoName(4242), "errno 4242");
    EXPECT_EQ(verbsError("ibv_open_device", 4242).code(), StatusCode::kInternal);
}

TEST(CompletionError, EveryWorkCompletionStatus) {
    EXPECT_TRUE(completionError(IBV_WC_SUCCESS, "success", "x").ok());
    const struct {
        ibv_wc_status wc;
        StatusCode code;
    } table[] = {
        {IBV_WC_LOC_LEN_ERR, StatusCode::kInvalidArgument},
        {IBV_WC_LOC_QP_OP_ERR, StatusCode::kInvalidArgument},
        {IBV_WC_LOC_EEC_OP_ERR, StatusCode::kInvalidArgument},
        {IBV_WC_LOC_PROT_ERR, StatusCode::kOutOfRange},
        {IBV_WC_WR_FLUSH_ERR, StatusCode::kAborted},
        {IBV_WC_MW_BIND_ERR, StatusCode::kInvalidArgument},
        {IBV_WC_BAD_RESP_ERR, StatusCode::kPeerFailure},
        {IBV_WC_LOC_ACCESS_ERR, StatusCode::kOutOfRange},
        {IBV_WC_REM_INV_REQ_ERR, StatusCode::kPeerFailure},
        {IBV_WC_REM_ACCESS_ERR, StatusCode::kOutOfRange},
        {IBV_WC_REM_OP_ERR, StatusCode::kPeerFailure},
        {IBV_WC_RETRY_EXC_ERR, StatusCode::kPeerFailure},
        {IBV_WC_RNR_RETRY_EXC_ERR, StatusCode::kPeerFailure},
        {IBV_WC_LOC_RDD_VIOL_ERR, StatusCode::kInvalidArgument},
        {IBV_WC_REM_INV_RD_REQ_ERR, StatusCode::kOutOfRange},
        {IBV_WC_REM_ABORT_ERR, StatusCode::kPeerFailure},
        {IBV_WC_INV_EECN_ERR, StatusCode::kPeerFailure},
        {IBV_WC_INV_EEC_STATE_ERR, StatusCode::kPeerFailure},
        {IBV_WC_FATAL_ERR, StatusCode::kInternal},
        {IBV_WC_RESP_TIMEOUT_ERR, StatusCode::kPeerFailure},
        {IBV_WC_GENERAL_ERR, StatusCode::kInternal},
        {IBV_WC_TM_ERR, StatusCode::kInternal},
        {IBV_WC_TM_RNDV_INCOMPLETE, StatusCode::kInternal},
    };
    // The table covers the enum: its last value is the last row.
    EXPECT_EQ(static_cast<int>(sizeof(table) / sizeof(table[0])),
              static_cast<int>(IBV_WC_TM_RNDV_INCOMPLETE));
    for (const auto& row : table) {
        Status st = completionError(row.wc, "text", "segment b");
        EXPECT_EQ(st.code(), row.code) << "wc status " << row.wc;
        EXPECT_EQ(st.message(),
                  "work completion failed: text (" + std::to_string(row.wc) + ") for segment b");
    }
}

TEST(VerbsApiLoad, MissingLibraryIsUnavailable) {
    auto api = VerbsApi::load("libmc_no_such_verbs.so.1");
    ASSERT_FALSE(api.ok());
    EXPECT_EQ(api.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(api.status().message().find("the verbs library is missing"), std::string::npos)
        << api.status().message();
}

TEST(VerbsApiLoad, LibraryWithoutTheSymbolsIsUnavailable) {
    // libc has none of the verbs symbols: every one is named.
    auto api = VerbsApi::load("libc.so.6");
    ASSERT_FALSE(api.ok());
    EXPECT_EQ(api.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(api.status().message().find("lacks ibv_get_device_list"), std::string::npos)
        << api.status().message();
    EXPECT_NE(api.status().message().find("ibv_wc_status_str"), std::string::npos);
}

}  // namespace
}  // namespace mooncake::te::rdma
