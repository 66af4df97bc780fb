// What a device collective kernel knows about its group, and what it reports
// back. Plain types only: shared by host code (which fills them) and kernels
// (which get them by value), with no CUDA or torch headers.
//
// Every rank owns one window of device memory that every member has mapped
// (transfer engine cuda_ipc). A window starts with a header of flags and call
// signatures, one per source rank and parity, followed by the data slots:
//
//   flags[2][kMaxDeviceRanks]       u64, written by the source after its data
//   signatures[2][kMaxDeviceRanks]  u64, the source's call signature
//   slots[2][size][slot_bytes]      the sources' payloads
//
// A call runs as one or more steps (chunks of a message larger than a slot,
// the two phases of a two-shot all_reduce); in every step each member
// signals every member (itself included). Steps alternate between the two
// parities: step j of call seq uses parity (seq + j) % 2, and every call runs
// an odd number of steps, so consecutive steps of consecutive calls alternate
// too. A flag holds the step's tag, (epoch << kSeqBits) | (seq << kStepBits
// | j), so a flag of an older step or of an older membership epoch never
// satisfies a wait. A member signals a step only after it finished reading
// the step before, so a parity's data may be rewritten once every member has
// signalled the step in between.
//
// The header's second half holds words private to the window's owner: the
// arrival counter the blocks of a kernel use to find the last one to finish
// (which then raises the step's flags), the failed-call word, and the call
// counter. A group's calls are queued on one stream, so one counter serves
// them all.
//
// Call numbers: with DeviceGroupView::seq_on_device the kernels take a call's
// seq from the owner's call counter and the call's last kernel advances it,
// so calls replayed from a CUDA graph (whose arguments are frozen at capture)
// number themselves, in step with the calls queued around them. Every member
// runs the same calls, so the counters agree; the host zeroes its counter in
// stream order when a new epoch starts. Without it the host's `seq` argument
// is the number.
#pragma once

#include <cstddef>
#include <cstdint>

// The layout functions are used by host code and kernels alike.
#if defined(__CUDACC__)
#define MC_HOST_DEVICE __host__ __device__
#else
#define MC_HOST_DEVICE
#endif

namespace mooncake::pg::device {

inline constexpr int kMaxDeviceRanks = 64;
inline constexpr int kSeqBits = 40;
inline constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;

inline constexpr uint64_t kWindowHeaderBytes = 4096;
inline constexpr uint64_t kArrivalOffset = 2 * 2 * kMaxDeviceRanks * sizeof(uint64_t);
// Holds the step-0 tag of the last call that failed here, so that spinning
// threads learn of a failure from device memory: reading the host-mapped
// result or abort word from every spinning thread floods the bus.
inline constexpr uint64_t kFailedCallOffset = kArrivalOffset + sizeof(uint64_t);
// The owner's call counter (seq_on_device).
inline constexpr uint64_t kCallSeqOffset = kFailedCallOffset + sizeof(uint64_t);
static_assert(kCallSeqOffset + sizeof(uint64_t) <= kWindowHeaderBytes,
              "flags, signatures and the private words must fit the window header");
// Steps per call: the tag's sequence field is (seq << kStepBits) | step.
inline constexpr int kStepBits = 20;
inline constexpr uint64_t kMaxStepsPerCall = uint64_t{1} << kStepBits;

MC_HOST_DEVICE inline constexpr uint64_t flagOffset(int parity, int src) {
    return (static_cast<uint64_t>(parity) * kMaxDeviceRanks + static_cast<uint64_t>(src)) * 8;
}
MC_HOST_DEVICE inline constexpr uint64_t signatureOffset(int parity, int src) {
    return 2 * kMaxDeviceRanks * 8 + flagOffset(parity, src);
}
MC_HOST_DEVICE inline constexpr uint64_t slotOffset(int parity, int src, int size,
                                                    uint64_t slot_bytes) {
    return kWindowHeaderBytes + (static_cast<uint64_t>(parity) * static_cast<uint64_t>(size) +
                                 static_cast<uint64_t>(src)) *
                                    slot_bytes;
}
// The window a group of `size` ranks needs for `slot_bytes` per source.
MC_HOST_DEVICE inline constexpr uint64_t windowBytes(int size, uint64_t slot_bytes) {
    return slotOffset(2, 0, size, slot_bytes);
}

MC_HOST_DEVICE inline constexpr uint64_t callTag(uint64_t epoch, uint64_t seq) {
    return (epoch << kSeqBits) | (seq & kSeqMask);
}
// The flag value of step `step` of call `seq`; step 0's is callTag(epoch, seq
// << kStepBits).
MC_HOST_DEVICE inline constexpr uint64_t stepTag(uint64_t epoch, uint64_t seq, uint64_t step) {
    return callTag(epoch, (seq << kStepBits) | step);
}
// stepTag's fields back from a flag value (for messages).
struct StepTagFields {
    uint64_t epoch = 0;
    uint64_t seq = 0;
    uint64_t step = 0;
};
MC_HOST_DEVICE inline constexpr StepTagFields stepTagFields(uint64_t tag) {
    return StepTagFields{tag >> kSeqBits, (tag & kSeqMask) >> kStepBits,
                         tag & (kMaxStepsPerCall - 1)};
}
MC_HOST_DEVICE inline constexpr int stepParity(uint64_t seq, uint64_t step) {
    return static_cast<int>((seq + step) & 1);
}

struct DeviceGroupView {
    int rank = 0;
    int size = 0;
    // Every member's window as mapped in this process (this rank's included),
    // all laid out as above with the same slot_bytes.
    char* windows[kMaxDeviceRanks] = {};
    uint64_t slot_bytes = 0;
    // The membership epoch the call was enqueued (or captured) under, and the
    // group's current one in device-readable memory: a call whose epoch is no
    // longer current (a graph replayed after a membership change) fails
    // without touching any peer.
    uint64_t epoch = 0;
    const volatile uint64_t* current_epoch = nullptr;
    // Host-mapped word the host sets to a nonzero reason on evidence of a
    // failure (dead peer, abort notice, deactivation); every spin checks it.
    const volatile uint64_t* abort_word = nullptr;
    // Every spin gives up after this long; negative: never.
    int64_t timeout_ns = -1;
    // Calls take their seq from this rank's call counter (see the top of
    // this file) instead of the host's argument.
    bool seq_on_device = false;
    // Most blocks one kernel of a chunked collective runs. Every block spins
    // on peers' flags, so the kernels of all members must fit on the device
    // at once; 0 picks that share (2 blocks per SM / size). Tests running
    // several groups at once on one GPU lower it.
    int max_blocks = 0;
};

enum class DeviceStatus : int32_t {
    kOk = 0,
    kTimeout = 1,     // a peer did not signal in time; culprit is that peer
    kAborted = 2,     // the host set the abort word; detail is its value
    kMismatch = 3,    // a peer's call signature differs; detail is the peer's
    kStaleEpoch = 4,  // the call's epoch is not the group's current one
    // Taken by the first failure while it writes culprit and detail; the
    // status follows them. Never the value of a finished call.
    kClaimed = -1,
};

// Written by the kernels (first failure wins: it claims the status, writes
// culprit and detail, then the status), read by the host once the call has
// ended, or at any time for a replay's result (a claimed status reads as
// none yet). Lives in host-mapped memory.
struct DeviceOpResult {
    int32_t status = 0;
    int32_t culprit = -1;
    uint64_t detail = 0;
    // Nonzero once every block of the call's last kernel is done, its stores
    // (output and the fields above) fenced before (markCallEnded): the host
    // reads the result then instead of querying an event, which would take
    // the CUDA driver's lock that the launching threads need.
    uint64_t ended = 0;
};

// A call's identity as every rank must agree on it: the collective, the
// element type, the reduction and the element count.
MC_HOST_DEVICE inline constexpr uint64_t callSignature(uint8_t collective, uint8_t dtype,
                                                       uint8_t op, uint64_t count) {
    return (static_cast<uint64_t>(collective) << 56) | (static_cast<uint64_t>(dtype) << 48) |
           (static_cast<uint64_t>(op) << 40) | (count & ((uint64_t{1} << 40) - 1));
}

}  // namespace mooncake::pg::device
