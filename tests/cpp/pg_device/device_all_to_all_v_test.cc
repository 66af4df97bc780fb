// all_to_all with split sizes: the host plan (every pair checked, every block
// bounded, the same verdict on every rank; no GPU needed) and the direct
// kernel between processes on the one GPU, exact for uneven blocks with empty
// ones among them.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "mooncake-pg/device/all_to_all_v.h"
#include "mooncake-pg/device/member_buffers.h"
#include "tests/cpp/pg_device/device_group_util.h"
#include "tests/cpp/pg_device/run_ranks.h"

namespace mooncake::pg::device::test {
namespace {

// Bytes rank s sends rank r: uneven, and none from s to r when r == s + 1.
uint64_t blockBytes(int s, int r) {
    return r == s + 1 ? 0 : static_cast<uint64_t>(16 * (s + 1) + 3 * r + 1);
}

// Every rank's row as a rank of `size` passes it: blocks packed in rank order.
std::vector<AllToAllVRow> rowsOf(int size) {
    std::vector<AllToAllVRow> rows(static_cast<size_t>(size));
    for (int p = 0; p < size; ++p) {
        AllToAllVRow& row = rows[p];
        for (int q = 0; q < size; ++q) {
            row.send_offsets.push_back(row.input_bytes);
            row.send_bytes.push_back(blockBytes(p, q));
            row.input_bytes += blockBytes(p, q);
            row.recv_offsets.push_back(row.output_bytes);
            row.recv_bytes.push_back(blockBytes(q, p));
            row.output_bytes += blockBytes(q, p);
        }
    }
    return rows;
}

TEST(DeviceAllToAllVPlan, PullsBlockRankOfEveryMemberIntoItsPlace) {
    const std::vector<AllToAllVRow> rows = rowsOf(3);
    AllToAllVPlan plan;
    ASSERT_TRUE(planAllToAllV(rows, 1, &plan).ok());
    for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(plan.bytes[s], blockBytes(s, 1)) << s;
        EXPECT_EQ(plan.src_offset[s], rows[s].send_offsets[1]) << s;
        EXPECT_EQ(plan.dst_offset[s], rows[1].recv_offsets[s]) << s;
    }
    EXPECT_EQ(plan.bytes[0], 0u);  // 0 sends nothing to 1
    // Every rank plans from the same rows: the same fingerprint, below 2^40.
    AllToAllVPlan other;
    ASSERT_TRUE(planAllToAllV(rows, 2, &other).ok());
    EXPECT_EQ(plan.fingerprint, other.fingerprint);
    EXPECT_LT(plan.fingerprint, uint64_t{1} << 40);
    std::vector<AllToAllVRow> moved = rows;
    moved[0].input_bytes += 1;  // a larger input, same blocks: another exchange
    ASSERT_TRUE(planAllToAllV(moved, 1, &other).ok());
    EXPECT_NE(plan.fingerprint, other.fingerprint);
}

TEST(DeviceAllToAllVPlan, ASizeMismatchFailsEveryRankWithOneText) {
    std::vector<AllToAllVRow> rows = rowsOf(3);
    rows[2].recv_bytes[0] += 8;  // rank 2 expects 8 more bytes from rank 0
    rows[2].output_bytes += 8;
    std::string first;
    for (int rank = 0; rank < 3; ++rank) {
        AllToAllVPlan plan;
        const Status s = planAllToAllV(rows, rank, &plan);
        ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << rank;
        if (rank == 0)
            first = s.message();
        EXPECT_EQ(s.message(), first) << rank;
    }
    EXPECT_NE(first.find("rank 0 sends " + std::to_string(blockBytes(0, 2)) +
                         " bytes to rank 2, which expects " + std::to_string(blockBytes(0, 2) + 8) +
                         " bytes from it"),
              std::string::npos)
        << first;
}

TEST(DeviceAllToAllVPlan, BlocksOutsideABufferAreRefusedBeforeAnyCopy) {
    AllToAllVPlan plan;
    std::vector<AllToAllVRow> rows = rowsOf(2);
    rows[1].send_offsets[0] = rows[1].input_bytes;  // starts at the end, not empty
    Status s = planAllToAllV(rows, 0, &plan);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("rank 1's input block for rank 0"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("lies outside its input"), std::string::npos) << s.message();

    rows = rowsOf(2);
    rows[0].recv_offsets[1] = ~uint64_t{0} - 2;  // would wrap around
    s = planAllToAllV(rows, 1, &plan);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("lies outside its output"), std::string::npos) << s.message();

    rows = rowsOf(2);
    rows[1].recv_bytes.pop_back();
    EXPECT_EQ(planAllToAllV(rows, 0, &plan).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(planAllToAllV(rowsOf(2), 2, &plan).code(), StatusCode::kInvalidArgument);
}

// The direct all_to_all with split sizes offers its input to the members
// only when it shares no byte with its output; the ranges have their own
// sizes (a small input next to a large output does not overlap it).
TEST(DeviceAllToAllVPlan, OverlapIsJudgedOnEachBuffersOwnBytes) {
    char buf[256];
    EXPECT_FALSE(device::rangesOverlap(buf, 16, buf + 16, 200));
    EXPECT_FALSE(device::rangesOverlap(buf + 100, 50, buf, 100));
    EXPECT_TRUE(device::rangesOverlap(buf, 17, buf + 16, 200));
    EXPECT_TRUE(device::rangesOverlap(buf + 16, 200, buf, 17));
    EXPECT_TRUE(device::rangesOverlap(buf + 20, 1, buf, 256));
    EXPECT_FALSE(device::rangesOverlap(buf, 0, buf, 256)) << "an empty range overlaps nothing";
    // The former check, max(in, out) bytes from each start, called the first
    // pair overlapping.
    EXPECT_TRUE(device::bytesOverlap(buf, buf + 16, 200));
}

TEST(DeviceAllToAllVPlan, RowsTravelAsWords) {
    const std::vector<AllToAllVRow> rows = rowsOf(4);
    for (const AllToAllVRow& row : rows) {
        const std::vector<uint64_t> words = rowWords(row);
        ASSERT_EQ(words.size(), 4u * 4 + 2);
        auto back = rowFromWords(words.data(), 4);
        ASSERT_TRUE(back.ok());
        EXPECT_EQ(rowWords(back.value()), words);
    }
    EXPECT_FALSE(rowFromWords(nullptr, 0).ok());
}

// The kernel: rank r's output holds, in rank order, block r of every
// member's input. Returns 0 or a failing exit code.
int unevenBlocks(const std::string& dir, int rank, int size) {
    Rank r;
    if (int rc = setUp(r, dir, rank, size, 4096); rc != 0)
        return rc;
    const std::vector<AllToAllVRow> rows = rowsOf(size);
    const AllToAllVRow& mine = rows[rank];
    // Every rank allocates the largest input, so the buffers share one size.
    uint64_t capacity = 0;
    for (const AllToAllVRow& row : rows)
        capacity = std::max(capacity, std::max(row.input_bytes, row.output_bytes));
    const auto pattern = [](int s, int r, uint64_t i) {
        return static_cast<uint8_t>((s * 31 + r * 7 + i) % 251);
    };
    std::vector<uint8_t> in(capacity, 0xee), out(capacity);
    for (int q = 0; q < size; ++q) {
        for (uint64_t i = 0; i < mine.send_bytes[q]; ++i)
            in[mine.send_offsets[q] + i] = pattern(rank, q, i);
    }
    uint8_t* d_in = nullptr;
    uint8_t* d_out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&d_in, capacity));
    CUDA_CHILD_OK(cudaMalloc(&d_out, capacity));
    CUDA_CHILD_OK(cudaMemcpy(d_in, in.data(), capacity, cudaMemcpyHostToDevice));
    CUDA_CHILD_OK(cudaMemset(d_out, 0, capacity));
    Sharing s;
    MemberBuffers b;
    int rc = shareMemberBuffers(r, s, "v", d_in, d_in, capacity, &b);
    b.outputs[rank] = d_out;
    AllToAllVPlan plan;
    CHILD_OK(planAllToAllV(rows, rank, &plan));
    if (rc == 0) {
        r.clearResult();
        CHILD_OK(directAllToAllV(r.view, b, plan, mine.input_bytes, mine.output_bytes, 0,
                                 r.deviceResult(), r.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(r.stream));
        CHILD_CHECK(r.hostResult()->status == 0);
        CUDA_CHILD_OK(cudaMemcpy(out.data(), d_out, capacity, cudaMemcpyDeviceToHost));
        for (int src = 0; src < size && rc == 0; ++src) {
            for (uint64_t i = 0; i < mine.recv_bytes[src]; ++i) {
                if (out[mine.recv_offsets[src] + i] != pattern(src, rank, i)) {
                    std::fprintf(stderr, "rank %d block from %d byte %llu differs\n", rank, src,
                                 static_cast<unsigned long long>(i));
                    rc = 1;
                    break;
                }
            }
        }
        // Nothing written past the blocks.
        for (uint64_t i = mine.output_bytes; i < capacity && rc == 0; ++i)
            rc = out[i] == 0 ? 0 : 1;
    }
    CHILD_OK(barrier(*r.store, "v_done", size));
    s.peers.clear();
    CHILD_OK(barrier(*r.store, "v_unmapped", size));
    cudaFree(d_in);
    cudaFree(d_out);
    return rc;
}

class DeviceDirectAllToAllV : public ::testing::TestWithParam<int> {};

TEST_P(DeviceDirectAllToAllV, UnevenBlocksAreExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    const int size = GetParam();
    runRanks(size, [&](int rank) { return unevenBlocks(dir.path(), rank, size); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceDirectAllToAllV, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace mooncake::pg::device::test
