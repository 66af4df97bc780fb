// A rank that is not an active member runs its collectives local-only over a
// SoloFabric: it is alone among the group's slots, so per-rank blocks keep
// their meaning: only its own block (at its rank) is read or written.
#include <cstdint>
#include <memory>
#include <vector>

#include "tests/cpp/pg/collectives_test_util.h"

namespace mooncake::pg {
namespace {

constexpr int kSlots = 4;
constexpr int kMe = 2;

class SoloCollectives : public ::testing::Test {
protected:
    void SetUp() override {
        const CommOptions options = testutil::smallOptions();
        fabric_ = std::make_shared<SoloFabric>(kMe, kSlots,
                                               Communicator::windowBytesFor(kSlots, options));
        comm_ = std::make_unique<Communicator>(fabric_, options);
        std::vector<uint8_t> only_me(kSlots, 0);
        only_me[kMe] = 1;
        ASSERT_TRUE(comm_->setMembership(only_me, 0).ok());
    }
    std::shared_ptr<Fabric> fabric_;
    std::unique_ptr<Communicator> comm_;
};

TEST_F(SoloCollectives, AllReduceIsTheOwnInput) {
    std::vector<int32_t> v = {5, -7, 9};
    ASSERT_TRUE(comm_
                    ->allReduce(v.data(), v.data(), v.size(), DataType::kInt32, ReduceOp::kSum,
                                testutil::generous())
                    .ok());
    EXPECT_EQ(v, (std::vector<int32_t>{5, -7, 9}));
}

TEST_F(SoloCollectives, AllGatherWritesOnlyTheOwnBlock) {
    const std::vector<int32_t> in = {11, 12};
    std::vector<int32_t> out(2 * kSlots, -1);
    ASSERT_TRUE(comm_->allGather(in.data(), out.data(), in.size() * 4, testutil::generous()).ok());
    EXPECT_EQ(out, (std::vector<int32_t>{-1, -1, -1, -1, 11, 12, -1, -1}));
}

TEST_F(SoloCollectives, ReduceScatterTakesTheOwnBlock) {
    std::vector<float> in(3 * kSlots);
    for (size_t i = 0; i < in.size(); ++i)
        in[i] = static_cast<float>(i);
    std::vector<float> out(3, -1.0f);
    ASSERT_TRUE(comm_
                    ->reduceScatter(in.data(), out.data(), 3, DataType::kFloat32, ReduceOp::kSum,
                                    testutil::generous())
                    .ok());
    EXPECT_EQ(out, (std::vector<float>{6.0f, 7.0f, 8.0f}));
}

TEST_F(SoloCollectives, AllToAllMovesOnlyTheOwnPiece) {
    const std::vector<uint8_t> in = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<uint8_t> out(8, 0);
    const std::vector<size_t> bytes = {2, 2, 2, 2};
    const std::vector<size_t> offsets = {0, 2, 4, 6};
    ASSERT_TRUE(
        comm_
            ->allToAllV(in.data(), bytes, offsets, out.data(), bytes, offsets, testutil::generous())
            .ok());
    EXPECT_EQ(out, (std::vector<uint8_t>{0, 0, 0, 0, 5, 6, 0, 0}));
}

TEST_F(SoloCollectives, RootedCallsNeedThisRankAsRoot) {
    std::vector<uint8_t> buf = {1, 2};
    EXPECT_TRUE(comm_->broadcast(buf.data(), buf.size(), kMe, testutil::generous()).ok());
    Status st = comm_->broadcast(buf.data(), buf.size(), 0, testutil::generous());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    std::vector<uint8_t> gathered(2 * kSlots, 9);
    ASSERT_TRUE(comm_->gather(buf.data(), gathered.data(), 2, kMe, testutil::generous()).ok());
    EXPECT_EQ(gathered, (std::vector<uint8_t>{9, 9, 9, 9, 1, 2, 9, 9}));
    EXPECT_TRUE(comm_->barrier(testutil::generous()).ok());
}

TEST(SoloFabricTest, PutsToPeersFail) {
    SoloFabric fabric(1, 3, 256);
    const uint8_t byte = 7;
    EXPECT_EQ(fabric.put(0, 0, &byte, 1, Deadline::afterMs(1000)).code(), StatusCode::kUnavailable);
    EXPECT_EQ(fabric.putFlag(2, 0, 1, Deadline::afterMs(1000)).code(), StatusCode::kUnavailable);
    EXPECT_EQ(fabric.peerWindow(0), nullptr);
    EXPECT_TRUE(fabric.peerFailed(0));
    EXPECT_FALSE(fabric.peerFailed(1));
}

}  // namespace
}  // namespace mooncake::pg
