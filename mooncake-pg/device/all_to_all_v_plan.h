// all_to_all with split sizes, the host's part (no CUDA headers): the rows
// the members exchange before a call and the plan each rank makes from all
// of them. The split sizes differ per rank, so every rank plans from every
// member's row (what it sends to and expects from each member): the same
// rows give every rank the same verdict, so a size mismatch between ranks
// fails on all of them with one text, before any kernel is queued. The plan
// bounds every block inside its sender's input and its receiver's output,
// so a peer's row never makes this rank read or write outside a buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

inline constexpr uint8_t kDirectAllToAllVCollective = 10;

// What one rank passes, in bytes, one entry per member: the blocks of its
// input it sends (member p's at send_offsets[p]) and the blocks of its
// output it expects (member p's at recv_offsets[p]), and its buffers' sizes.
struct AllToAllVRow {
    std::vector<uint64_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
    uint64_t input_bytes = 0;
    uint64_t output_bytes = 0;
};

// A row as the words the members exchange (4 * size + 2), and back.
std::vector<uint64_t> rowWords(const AllToAllVRow& row);
Result<AllToAllVRow> rowFromWords(const uint64_t* words, int size);

// This rank's part of a call, passed to the kernel by value.
struct AllToAllVPlan {
    uint64_t src_offset[kMaxDeviceRanks] = {};  // of this rank's block in member s's input
    uint64_t bytes[kMaxDeviceRanks] = {};       // from member s
    uint64_t dst_offset[kMaxDeviceRanks] = {};  // where member s's block goes in the output
    // Names the whole exchange in the call signature (its 40-bit count
    // field): a rank that planned from other rows fails as a mismatch.
    uint64_t fingerprint = 0;
};

// Plans `rank`'s part from every member's row (rows[p] is rank p's).
// InvalidArgument, the same text on every rank, for the first pair (s, r)
// in rank order where rank s's send_bytes[r] differs from rank r's
// recv_bytes[s], and for any block outside its rank's input or output.
Status planAllToAllV(const std::vector<AllToAllVRow>& rows, int rank, AllToAllVPlan* plan);

}  // namespace mooncake::pg::device
