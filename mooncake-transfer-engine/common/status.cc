#include "mooncake-transfer-engine/common/status.h"

namespace mooncake {

const char* statusCodeName(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "OK";
        case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
        case StatusCode::kNotFound: return "NOT_FOUND";
        case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
        case StatusCode::kTimeout: return "TIMEOUT";
        case StatusCode::kPeerFailure: return "PEER_FAILURE";
        case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
        case StatusCode::kUnavailable: return "UNAVAILABLE";
        case StatusCode::kAborted: return "ABORTED";
        case StatusCode::kInternal: return "INTERNAL";
        case StatusCode::kEpochChanged: return "EPOCH_CHANGED";
    }
    return "UNKNOWN";
}

std::string Status::toString() const {
    if (ok()) return "OK";
    return std::string(statusCodeName(code_)) + ": " + message_;
}

Status Status::withContext(std::string_view context) const {
    if (ok()) return *this;
    return Status(code_, std::string(context) + ": " + message_);
}

}  // namespace mooncake
