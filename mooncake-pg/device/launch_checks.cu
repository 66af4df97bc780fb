#include "mooncake-pg/device/launch_checks.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::pg::device {

namespace {

// Threads per block of the chunked kernels (step_kernel.cuh) and the bytes
// one block moves per pass before another block pays off.
constexpr uint64_t kBytesPerBlock = 512 * 16 * 4;

int deviceShareBlocks(int size) {
    const int sms = currentDeviceSmCount();
    // The members' kernels spin on each other's flags, so while one member's
    // kernel waits, the others' must still find room to run. One block per
    // SM per member keeps the spinning blocks of all but one member below the
    // SM count, whatever the packing. Two per SM (all the kernels are built
    // to fit) hung 4 processes on one H200 under MPS: 3 x 66 spinning blocks
    // left no room for the 4th member's first kernel.
    return std::max(1, sms / std::max(1, size));
}

}  // namespace

Status checkGroup(const DeviceGroupView& g) {
    if (g.size < 1 || g.size > kMaxDeviceRanks)
        return InvalidArgument("device group size " + std::to_string(g.size) + " is not in [1, " +
                               std::to_string(kMaxDeviceRanks) + "]");
    if (g.rank < 0 || g.rank >= g.size)
        return InvalidArgument("device group rank " + std::to_string(g.rank) + " is not in [0, " +
                               std::to_string(g.size) + ")");
    for (int r = 0; r < g.size; ++r) {
        if (!g.windows[r])
            return InvalidArgument("the window of rank " + std::to_string(r) + " is not mapped");
    }
    if (!g.abort_word || !g.current_epoch)
        return InvalidArgument("the device group has no abort word or epoch word");
    if (g.max_blocks < 0)
        return InvalidArgument("device group max_blocks " + std::to_string(g.max_blocks) +
                               " is negative");
    return Status::OK();
}

Status checkChunkedCall(const DeviceGroupView& g, DeviceOpResult* result, const char* what) {
    MC_RETURN_IF_ERROR(checkGroup(g));
    if (!result)
        return InvalidArgument(std::string(what) + " needs a result word");
    if (g.slot_bytes == 0 || g.slot_bytes % 16 != 0)
        return InvalidArgument(std::string(what) + ": slot_bytes " + std::to_string(g.slot_bytes) +
                               " is not a positive multiple of 16");
    return Status::OK();
}

Status checkCount(uint64_t count, const char* what) {
    if (count >= (uint64_t{1} << 40))
        return InvalidArgument(std::string(what) + ": count " + std::to_string(count) +
                               " is not below 2^40");
    return Status::OK();
}

Status checkRoot(const DeviceGroupView& g, int root, const char* what) {
    if (root < 0 || root >= g.size)
        return InvalidArgument(std::string(what) + ": root " + std::to_string(root) +
                               " is not in [0, " + std::to_string(g.size) + ")");
    return Status::OK();
}

Status checkBuffer(const void* p, uint64_t bytes, const char* name, const char* what) {
    if (bytes > 0 && !p)
        return InvalidArgument(std::string(what) + ": " + name + " is null for " +
                               std::to_string(bytes) + " bytes");
    return Status::OK();
}

Status checkMemberBuffers(const DeviceGroupView& g, const MemberBuffers& b, uint64_t input_bytes,
                          uint64_t output_bytes, bool every_output, const char* what) {
    for (int r = 0; r < g.size; ++r) {
        const std::string member = "rank " + std::to_string(r) + "'s ";
        MC_RETURN_IF_ERROR(checkBuffer(b.inputs[r], input_bytes, (member + "input").c_str(), what));
        if (every_output || r == g.rank) {
            MC_RETURN_IF_ERROR(
                checkBuffer(b.outputs[r], output_bytes, (member + "output").c_str(), what));
        }
    }
    return Status::OK();
}

Status checkDirectCall(const DeviceGroupView& g, DeviceOpResult* result, const MemberBuffers& b,
                       uint64_t count, uint64_t input_bytes, uint64_t output_bytes,
                       bool every_output, const char* what) {
    MC_RETURN_IF_ERROR(checkChunkedCall(g, result, what));
    MC_RETURN_IF_ERROR(checkCount(count, what));
    return checkMemberBuffers(g, b, input_bytes, output_bytes, every_output, what);
}

Status checkDirectReduction(const DeviceGroupView& g, DeviceOpResult* result,
                            const MemberBuffers& b, uint64_t count, DataType dtype, ReduceOp op,
                            uint64_t input_bytes, uint64_t output_bytes, bool every_output,
                            const char* what) {
    std::string why;
    if (!reduceOpSupported(op, dtype, &why))
        return InvalidArgument(std::string(what) + ": " + why);
    return checkDirectCall(g, result, b, count, input_bytes, output_bytes, every_output, what);
}

Status stepsFor(uint64_t chunks, uint64_t steps_per_chunk, const char* what, uint64_t* steps) {
    uint64_t n = std::max<uint64_t>(chunks, 1) * steps_per_chunk;
    n |= 1;
    if (n > kMaxStepsPerCall)
        return InvalidArgument(std::string(what) + " needs " + std::to_string(n) +
                               " steps, more than " + std::to_string(kMaxStepsPerCall) +
                               ": use larger slots");
    *steps = n;
    return Status::OK();
}

unsigned gridBlocks(const DeviceGroupView& g, uint64_t bytes) {
    const uint64_t cap = g.max_blocks > 0 ? static_cast<uint64_t>(g.max_blocks)
                                          : static_cast<uint64_t>(deviceShareBlocks(g.size));
    const uint64_t want = std::max<uint64_t>(1, divUp(bytes, kBytesPerBlock));
    return static_cast<unsigned>(std::min(want, cap));
}

}  // namespace mooncake::pg::device
