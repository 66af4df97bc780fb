// The WQE encoder compiled by nvcc and run on the GPU writes exactly the
// bytes the host encoder writes (which mlx5_wqe_test.cc checks against
// mlx5dv.h). Skips, saying why, where no GPU is usable.
#include <cstring>

#include <gtest/gtest.h>

#include "tests/cpp/rdma/mlx5_wqe_device.h"

namespace mooncake::te::rdma::mlx5 {
namespace {

TEST(Mlx5WqeDevice, KernelEncodesTheHostBytes) {
    const WriteWqe write{
        0x0041, 0x00abcdef, 0x00007f00aa000040ull, 0x11, 0x00007f00bb000080ull, 0x22, 65536,
        false,  false};
    const FetchAddWqe count{
        0x0042, 0x00abcdef, 0x00007f0000001000ull, 0x33, 0x00007f0000002008ull, 0x44, 1,
        true,   false};
    unsigned char device[128];
    uint32_t dbrec[2] = {0, 0};
    const std::string why = encodeOnDevice(write, count, device, dbrec);
    if (why.rfind("no usable CUDA device", 0) == 0)
        GTEST_SKIP() << why;
    ASSERT_EQ(why, "");
    alignas(64) unsigned char host[128];
    encodeRdma(host, write);
    encodeFetchAdd(host + 64, count);
    EXPECT_EQ(0, std::memcmp(device, host, 128));
    EXPECT_EQ(dbrec[0], 0u);
    EXPECT_EQ(dbrec[1], sendDoorbellValue(0x0043));
}

}  // namespace
}  // namespace mooncake::te::rdma::mlx5
