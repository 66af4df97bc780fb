// The public request/status types of the transfer engine.
#pragma once

#include <cstdint>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

using SegmentID = int64_t;
using BatchID = uint64_t;

// Transfers between this process's own registered regions.
inline constexpr SegmentID kLocalSegment = 0;

enum class TransferOpcode : uint8_t { kRead = 0, kWrite = 1 };

struct TransferRequest {
    TransferOpcode opcode = TransferOpcode::kWrite;
    void* source = nullptr;      // local address inside a registered region
    SegmentID target_id = -1;    // from TransferEngine::openSegment
    uint64_t target_offset = 0;  // remote virtual address inside a peer's registered region
    uint64_t length = 0;
};

enum class TransferState : uint8_t { kPending = 0, kCompleted = 1, kFailed = 2 };

struct TransferStatus {
    TransferState state = TransferState::kPending;
    Status error;  // set when kFailed: the reason
};

inline const char* transferStateName(TransferState s) {
    switch (s) {
        case TransferState::kPending: return "PENDING";
        case TransferState::kCompleted: return "COMPLETED";
        case TransferState::kFailed: return "FAILED";
    }
    return "?";
}

}  // namespace mooncake::te
