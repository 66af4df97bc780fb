// Host-side checks and sizing shared by the device collectives: what every
// call verifies before queuing anything, and how many blocks and steps a
// chunked call runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

// The group is usable by any device collective: size and rank in range,
// every member's window mapped, the abort and epoch words present.
Status checkGroup(const DeviceGroupView& g);

// checkGroup, plus what chunked collectives need: a result word and slots of
// a positive multiple of 16 bytes (so chunk boundaries keep 16-byte vectors
// aligned in the windows). `what` names the collective in errors.
Status checkChunkedCall(const DeviceGroupView& g, DeviceOpResult* result, const char* what);

// The element count fits the call signature's 40-bit field.
Status checkCount(uint64_t count, const char* what);

// `root` is a rank of the group (broadcast, gather, scatter).
Status checkRoot(const DeviceGroupView& g, int root, const char* what);

// A buffer of `bytes` > 0 must not be null; `name` is the argument's name.
Status checkBuffer(const void* p, uint64_t bytes, const char* name, const char* what);
// Every member's input of `input_bytes`, and the outputs of `output_bytes`
// (every member's when `every_output`, else this rank's) are mapped.
Status checkMemberBuffers(const DeviceGroupView& g, const MemberBuffers& b, uint64_t input_bytes,
                          uint64_t output_bytes, bool every_output, const char* what);

// What every direct call needs: checkChunkedCall, checkCount and
// checkMemberBuffers.
Status checkDirectCall(const DeviceGroupView& g, DeviceOpResult* result, const MemberBuffers& b,
                       uint64_t count, uint64_t input_bytes, uint64_t output_bytes,
                       bool every_output, const char* what);

// A direct reducing call: checkDirectCall and an op the dtype supports.
Status checkDirectReduction(const DeviceGroupView& g, DeviceOpResult* result,
                            const MemberBuffers& b, uint64_t count, DataType dtype, ReduceOp op,
                            uint64_t input_bytes, uint64_t output_bytes, bool every_output,
                            const char* what);

// The number of steps of a call with `chunks` chunks of `steps_per_chunk`
// steps each (at least one chunk, so that every member signals even for an
// empty message), padded to an odd number; an error if it exceeds
// kMaxStepsPerCall.
Status stepsFor(uint64_t chunks, uint64_t steps_per_chunk, const char* what, uint64_t* steps);

// Blocks for a kernel that moves about `bytes`: enough to keep the device's
// memory busy, at most the group's co-resident share (max_blocks).
unsigned gridBlocks(const DeviceGroupView& g, uint64_t bytes);

// Ceiling division.
inline constexpr uint64_t divUp(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

}  // namespace mooncake::pg::device
