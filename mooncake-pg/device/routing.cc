#include "mooncake-pg/device/routing.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/all_to_all_v_plan.h"
#include "mooncake-pg/device/broadcast.h"
#include "mooncake-pg/device/reduce_scatter.h"

namespace mooncake::pg::device {

const char* cudaPathName(CudaPath path) {
    return path == CudaPath::kKernels ? "kernels" : "staged";
}

namespace {

// A byte count from the environment: a positive multiple of `multiple` up to
// `max`; null or empty: `fallback`.
Result<uint64_t> parseByteCount(const char* env, const char* value, uint64_t multiple, uint64_t max,
                                uint64_t fallback, const char* what) {
    if (value == nullptr || *value == '\0')
        return fallback;
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(value, &end, 10);
    const bool digits = *value >= '0' && *value <= '9';
    if (!digits || errno != 0 || end == value || *end != '\0' || v == 0 || v % multiple != 0 ||
        v > max) {
        return InvalidArgument(std::string(env) + "='" + value + "' is not " + what +
                               "; expected a positive multiple of " + std::to_string(multiple) +
                               " bytes up to " + std::to_string(max));
    }
    return static_cast<uint64_t>(v);
}

// One of a setting's two values: its name, what it means, what it parses to.
struct Choice {
    const char* name;
    const char* meaning;
    bool value;
};

// A setting from the environment that takes `first` or `second` (named in
// that order in the error); null or empty: `fallback`.
Result<bool> parseChoice(const char* env, const char* value, const char* what, Choice first,
                         Choice second, bool fallback) {
    if (value == nullptr || *value == '\0')
        return fallback;
    for (const Choice& c : {first, second}) {
        if (std::strcmp(value, c.name) == 0)
            return c.value;
    }
    return InvalidArgument(std::string(env) + "='" + value + "' is not " + what + "; expected '" +
                           first.name + "' (" + first.meaning + ") or '" + second.name + "' (" +
                           second.meaning + ")");
}

}  // namespace

Result<CudaPath> parseCudaPath(const char* value) {
    MC_ASSIGN_OR_RETURN(
        const bool kernels,
        parseChoice(kCudaPathEnv, value, "a CUDA data path",
                    {"staged", "device -> host -> device through the host core", false},
                    {"kernels", "the device kernels", true},
                    kDefaultCudaPath == CudaPath::kKernels));
    return kernels ? CudaPath::kKernels : CudaPath::kStaged;
}

Result<uint64_t> parseSlotBytes(const char* value) {
    return parseByteCount(kCudaSlotBytesEnv, value, 16, kMaxSlotBytes, kDefaultSlotBytes,
                          "a slot size");
}

Result<uint64_t> parseP2PPoolBytes(const char* value) {
    return parseByteCount(kCudaP2PPoolBytesEnv, value, 4096, kMaxP2PPoolBytes, kDefaultP2PPoolBytes,
                          "a pool size");
}

Result<bool> parseBlockingWait(const char* value) {
    return parseChoice(kCudaBlockingWaitEnv, value, "a wait mode",
                       {"0", "wait() returns once the kernels are queued", false},
                       {"1", "wait() blocks until they have finished", true}, false);
}

Result<bool> parseDirect(const char* value) {
    return parseChoice(kCudaDirectEnv, value, "a setting",
                       {"1", "large collectives read the members' buffers directly", true},
                       {"0", "always through the windows", false}, true);
}

Result<bool> parseCallerLaunch(const char* value) {
    return parseChoice(kCudaCallerLaunchEnv, value, "a setting",
                       {"1", "the calling thread launches small synchronous calls", true},
                       {"0", "every call goes through the group's worker", false}, true);
}

Result<bool> parseP2PCopyWithKernel(const char* value) {
    return parseChoice(kCudaP2PCopyEnv, value, "a setting",
                       {"memcpy", "cudaMemcpyAsync, the default", false},
                       {"kernel", "a copy kernel on the SMs", true}, false);
}

Result<uint64_t> groupWindowBytes(int max_group_size, uint64_t slot_bytes) {
    if (max_group_size < 1 || max_group_size > kMaxDeviceRanks) {
        return InvalidArgument(
            "device window for max_group_size=" + std::to_string(max_group_size) +
            "; expected 1 to " + std::to_string(kMaxDeviceRanks) + " ranks");
    }
    if (slot_bytes == 0 || slot_bytes % 16 != 0 || slot_bytes > kMaxSlotBytes) {
        return InvalidArgument("device window slot of " + std::to_string(slot_bytes) +
                               " bytes; expected a positive multiple of 16 up to " +
                               std::to_string(kMaxSlotBytes));
    }
    return windowBytes(max_group_size, slot_bytes);
}

const char* cudaCollectiveName(CudaCollective c) {
    switch (c) {
        case CudaCollective::kAllReduce:
            return "all_reduce";
        case CudaCollective::kAllGather:
            return "all_gather";
        case CudaCollective::kReduceScatter:
            return "reduce_scatter";
        case CudaCollective::kAllToAll:
            return "all_to_all";
        case CudaCollective::kAllToAllV:
            return "all_to_all with split sizes";
        case CudaCollective::kBroadcast:
            return "broadcast";
        case CudaCollective::kReduce:
            return "reduce";
        case CudaCollective::kGather:
            return "gather";
        case CudaCollective::kScatter:
            return "scatter";
    }
    return "collective";
}

namespace {

CudaRoute staged(std::string* why, const std::string& reason) {
    if (why)
        *why = reason;
    return CudaRoute::kHostStaging;
}

// A peer's callSignature (device_group.h), in words.
std::string describeSignature(uint64_t sig) {
    const auto collective = static_cast<uint8_t>(sig >> 56);
    const auto dtype = static_cast<uint8_t>((sig >> 48) & 0xff);
    const auto op = static_cast<uint8_t>((sig >> 40) & 0xff);
    std::string text;
    bool reduction = false;
    switch (collective) {
        case kAllReduceCollective:
        case kDirectAllReduceCollective:
            text = "all_reduce";
            reduction = true;
            break;
        case kAllGatherCollective:
        case kDirectAllGatherCollective:
            text = "all_gather";
            break;
        case kReduceScatterCollective:
        case kDirectReduceScatterCollective:
            text = "reduce_scatter";
            reduction = true;
            break;
        case kAllToAllCollective:
        case kDirectAllToAllCollective:
            text = "all_to_all";
            break;
        case kBroadcastCollective:
            text = "broadcast";
            break;
        case kGatherCollective:
            text = "gather";
            break;
        case kScatterCollective:
            text = "scatter";
            break;
        case kDirectAllToAllVCollective:
            // The count field holds the exchange's fingerprint, not a count.
            return "all_to_all with other split sizes, unlike this rank's call";
        default:
            if (collective >= kReduceCollectiveBase &&
                collective < kDirectReduceCollectiveBase + kMaxDeviceRanks) {
                text = "reduce to root " +
                       std::to_string((collective - kReduceCollectiveBase) % kMaxDeviceRanks);
                reduction = true;
            } else {
                text = "device collective " + std::to_string(collective);
            }
    }
    text += " of dtype ";
    text += dtype <= static_cast<uint8_t>(DataType::kBool)
                ? dataTypeName(static_cast<DataType>(dtype))
                : std::to_string(dtype);
    if (reduction) {
        text += ", op ";
        text += op <= static_cast<uint8_t>(ReduceOp::kBxor)
                    ? reduceOpName(static_cast<ReduceOp>(op))
                    : std::to_string(op);
    } else if (collective == kBroadcastCollective || collective == kGatherCollective ||
               collective == kScatterCollective) {
        text += ", root " + std::to_string(op);
    }
    text += ", count " + std::to_string(sig & ((uint64_t{1} << 40) - 1));
    return text + ", unlike this rank's call";
}

bool isReduction(CudaCollective c) {
    return c == CudaCollective::kAllReduce || c == CudaCollective::kReduceScatter ||
           c == CudaCollective::kReduce;
}

}  // namespace

CudaRoute routeFor(CudaPath path, const RouteQuery& q, std::string* why) {
    if (path != CudaPath::kKernels)
        return staged(why, std::string(kCudaPathEnv) + " is 'staged'");
    switch (q.collective) {
        case CudaCollective::kAllReduce:
        case CudaCollective::kAllGather:
        case CudaCollective::kReduceScatter:
        case CudaCollective::kAllToAll:
        case CudaCollective::kAllToAllV:
        case CudaCollective::kBroadcast:
        case CudaCollective::kReduce:  // an all_reduce signed as a reduce (all_reduce.h)
        case CudaCollective::kGather:
        case CudaCollective::kScatter:
            break;
    }
    if (q.group_size < 2 || q.group_size > kMaxDeviceRanks) {
        return staged(why, "group of " + std::to_string(q.group_size) +
                               " ranks; the kernels take 2 to " + std::to_string(kMaxDeviceRanks));
    }
    // An empty message moves nothing: the core's path costs no copies either.
    if (q.count == 0)
        return staged(why, "empty message");
    // The call signature carries the count in 40 bits.
    if (q.count >= (uint64_t{1} << 40))
        return staged(why, "count " + std::to_string(q.count) + " exceeds the kernels' 2^40");
    if (isReduction(q.collective)) {
        std::string reason;
        if (!reduceOpSupported(q.op, q.dtype, &reason))
            return staged(why, reason);
    }
    if (why)
        why->clear();
    return CudaRoute::kKernel;
}

namespace {

// A timeout's detail: the last flag value the waiting rank saw from the peer
// (0: none since the window was created), as "call N step S of epoch E".
std::string lastSignal(uint64_t tag) {
    if (tag == 0)
        return " (no signal from it yet)";
    const StepTagFields f = stepTagFields(tag);
    return " (its last signal: call " + std::to_string(f.seq) + " step " + std::to_string(f.step) +
           " of epoch " + std::to_string(f.epoch) + ")";
}

}  // namespace

Status resultStatus(const DeviceOpResult& r, const char* what, std::vector<int>* failed) {
    failed->clear();
    const std::string op(what);
    switch (static_cast<DeviceStatus>(r.status)) {
        case DeviceStatus::kOk:
            return Status::OK();
        case DeviceStatus::kTimeout:
            if (r.culprit >= 0) {
                failed->push_back(r.culprit);
                return Timeout(op + ": waiting for rank " + std::to_string(r.culprit) +
                               " on the device" + lastSignal(r.detail));
            }
            return Timeout(op + ": waiting on the device");
        case DeviceStatus::kAborted:
            if ((r.detail & kAbortPeerDeadBase) != 0) {
                const int dead = static_cast<int>(r.detail & 0xffffffffu);
                failed->push_back(dead);
                return PeerFailure(op + ": rank " + std::to_string(dead) + " failed");
            }
            if ((r.detail & kAbortDeactivatedBase) != 0) {
                const int gone = static_cast<int>(r.detail & 0xffffffffu);
                failed->push_back(gone);
                return PeerFailure(op + ": rank " + std::to_string(gone) +
                                   " was deactivated while the call ran");
            }
            if (r.detail == kAbortDeadline) {
                if (r.culprit >= 0) {
                    failed->push_back(r.culprit);
                    return Timeout(op + ": waiting for rank " + std::to_string(r.culprit) +
                                   " on the device (the call's deadline passed)");
                }
                return Timeout(op + ": the call's deadline passed on the device");
            }
            return Aborted(op + ": the group was aborted");
        case DeviceStatus::kMismatch:
            return InvalidArgument(op + ": rank " + std::to_string(r.culprit) + " passed " +
                                   describeSignature(r.detail));
        case DeviceStatus::kStaleEpoch:
            return Aborted(op + ": the call's membership epoch is no longer the group's");
        case DeviceStatus::kClaimed:
            break;  // a failure still being written: never a finished call's
    }
    return Internal(op + ": unknown device status " + std::to_string(r.status));
}

bool isFailureEvidence(const DeviceOpResult& r) {
    switch (static_cast<DeviceStatus>(r.status)) {
        case DeviceStatus::kTimeout:
            return true;
        case DeviceStatus::kAborted:
            return (r.detail & kAbortPeerDeadBase) != 0 || r.detail == kAbortDeadline;
        default:
            return false;
    }
}

uint64_t abortReasonFor(int rank, int size, const std::function<bool(int)>& peer_dead,
                        const std::function<bool(int)>& still_active) {
    for (int p = 0; p < size; ++p) {
        if (p != rank && peer_dead(p))
            return abortPeerDead(p);
    }
    if (!still_active)
        return 0;
    for (int p = 0; p < size; ++p) {
        if (!still_active(p))
            return abortDeactivated(p);
    }
    return 0;
}

}  // namespace mooncake::pg::device
