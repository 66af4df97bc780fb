// The IBGDA queue code compiled by nvcc and run from a kernel against the
// software HCA. Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include "tests/cpp/rdma/ibgda_queue_device.h"

namespace mooncake::te::rdma {
namespace {

TEST(IbgdaQueueDevice, KernelPostsPutsTheSoftHcaExecutesInOrder) {
    // 5000 puts through 32 BBs: the queue fills and wraps many times.
    const std::string why = postPutsFromKernel(5000, 32);
    if (why.rfind("no usable CUDA device", 0) == 0)
        GTEST_SKIP() << why;
    EXPECT_EQ("", why);
}

}  // namespace
}  // namespace mooncake::te::rdma
