#include "mooncake-pg/device/all_to_all_v_plan.h"

#include <string>

namespace mooncake::pg::device {

namespace {

constexpr uint64_t kFingerprintMask = (uint64_t{1} << 40) - 1;

// Whether [offset, offset + bytes) fits in `limit` bytes, without overflow.
bool fits(uint64_t offset, uint64_t bytes, uint64_t limit) {
    return offset <= limit && bytes <= limit - offset;
}

std::string blockText(int owner, const char* side, int peer, uint64_t offset, uint64_t bytes) {
    return "rank " + std::to_string(owner) + "'s " + side + " block for rank " +
           std::to_string(peer) + " (" + std::to_string(bytes) + " bytes at offset " +
           std::to_string(offset) + ")";
}

// FNV-1a over the words: the same rows give every rank the same value.
uint64_t fingerprintOf(const std::vector<AllToAllVRow>& rows) {
    uint64_t h = 1469598103934665603ull;
    for (const AllToAllVRow& row : rows) {
        for (uint64_t w : rowWords(row)) {
            for (int b = 0; b < 8; ++b) {
                h ^= (w >> (8 * b)) & 0xff;
                h *= 1099511628211ull;
            }
        }
    }
    return h & kFingerprintMask;
}

}  // namespace

std::vector<uint64_t> rowWords(const AllToAllVRow& row) {
    std::vector<uint64_t> words;
    for (const auto* v : {&row.send_bytes, &row.send_offsets, &row.recv_bytes, &row.recv_offsets})
        words.insert(words.end(), v->begin(), v->end());
    words.push_back(row.input_bytes);
    words.push_back(row.output_bytes);
    return words;
}

Result<AllToAllVRow> rowFromWords(const uint64_t* words, int size) {
    if (size < 1 || size > kMaxDeviceRanks)
        return InvalidArgument("all_to_all row of " + std::to_string(size) +
                               " members; expected 1 to " + std::to_string(kMaxDeviceRanks));
    AllToAllVRow row;
    const auto n = static_cast<size_t>(size);
    for (auto* v : {&row.send_bytes, &row.send_offsets, &row.recv_bytes, &row.recv_offsets}) {
        v->assign(words, words + n);
        words += n;
    }
    row.input_bytes = words[0];
    row.output_bytes = words[1];
    return row;
}

Status planAllToAllV(const std::vector<AllToAllVRow>& rows, int rank, AllToAllVPlan* plan) {
    const int size = static_cast<int>(rows.size());
    if (size < 1 || size > kMaxDeviceRanks)
        return InvalidArgument("all_to_all with split sizes: " + std::to_string(size) +
                               " members; the kernels take 1 to " +
                               std::to_string(kMaxDeviceRanks));
    if (rank < 0 || rank >= size)
        return InvalidArgument("all_to_all with split sizes: rank " + std::to_string(rank) +
                               " is not in [0, " + std::to_string(size) + ")");
    const auto n = static_cast<size_t>(size);
    for (int p = 0; p < size; ++p) {
        const AllToAllVRow& row = rows[p];
        if (row.send_bytes.size() != n || row.send_offsets.size() != n ||
            row.recv_bytes.size() != n || row.recv_offsets.size() != n)
            return InvalidArgument("all_to_all with split sizes: rank " + std::to_string(p) +
                                   "'s row does not have one entry per member (" +
                                   std::to_string(size) + ")");
        for (int q = 0; q < size; ++q) {
            if (!fits(row.send_offsets[q], row.send_bytes[q], row.input_bytes))
                return InvalidArgument(
                    "all_to_all with split sizes: " +
                    blockText(p, "input", q, row.send_offsets[q], row.send_bytes[q]) +
                    " lies outside its input of " + std::to_string(row.input_bytes) + " bytes");
            if (!fits(row.recv_offsets[q], row.recv_bytes[q], row.output_bytes))
                return InvalidArgument(
                    "all_to_all with split sizes: " +
                    blockText(p, "output", q, row.recv_offsets[q], row.recv_bytes[q]) +
                    " lies outside its output of " + std::to_string(row.output_bytes) + " bytes");
        }
    }
    for (int s = 0; s < size; ++s) {
        for (int r = 0; r < size; ++r) {
            const uint64_t sent = rows[s].send_bytes[r];
            const uint64_t expected = rows[r].recv_bytes[s];
            if (sent != expected)
                return InvalidArgument("all_to_all with split sizes: rank " + std::to_string(s) +
                                       " sends " + std::to_string(sent) + " bytes to rank " +
                                       std::to_string(r) + ", which expects " +
                                       std::to_string(expected) + " bytes from it");
        }
    }
    *plan = AllToAllVPlan{};
    for (int s = 0; s < size; ++s) {
        plan->src_offset[s] = rows[s].send_offsets[rank];
        plan->bytes[s] = rows[rank].recv_bytes[s];
        plan->dst_offset[s] = rows[rank].recv_offsets[s];
    }
    plan->fingerprint = fingerprintOf(rows);
    return Status::OK();
}

}  // namespace mooncake::pg::device
