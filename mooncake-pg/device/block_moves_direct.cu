// The direct all_gather and all_to_all: each rank pulls one block from every
// member's own buffer into its output (all_gather: the member's whole input;
// all_to_all: block `rank` of it). Three steps, no window copies.
#include <string>

#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/launch_checks.h"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct DirectPullAlgo {
    MemberBuffers buffers;
    uint64_t block_bytes;
    // Where this rank's block starts in every member's input: 0 for
    // all_gather, rank * block_bytes for all_to_all.
    uint64_t source_offset;

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step != 0)
            return;
        char* own = static_cast<char*>(buffers.outputs[g.rank]);
        for (int src = 0; src < g.size; ++src) {
            gridCopy(own + src * block_bytes,
                     static_cast<const char*>(buffers.inputs[src]) + source_offset, block_bytes);
        }
    }
};

}  // namespace

Status directAllGather(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                       DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device direct all_gather";
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(
        checkDirectCall(group, result, buffers, count, bytes, bytes * group.size, false, kWhat));
    const uint64_t signature =
        callSignature(kDirectAllGatherCollective, static_cast<uint8_t>(dtype), 0, count);
    const DirectPullAlgo algo{buffers, bytes, 0};
    return launchSteps(group, algo, kDirectSteps, seq, signature, bytes * group.size, result,
                       stream, kWhat);
}

Status directAllToAll(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                      DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device direct all_to_all";
    const uint64_t block_bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    const uint64_t total = block_bytes * group.size;
    MC_RETURN_IF_ERROR(checkDirectCall(group, result, buffers, count, total, total, false, kWhat));
    if (bytesOverlap(buffers.inputs[group.rank], buffers.outputs[group.rank], total))
        return InvalidArgument(std::string(kWhat) + ": the output overlaps the input");
    const uint64_t signature =
        callSignature(kDirectAllToAllCollective, static_cast<uint8_t>(dtype), 0, count);
    const DirectPullAlgo algo{buffers, block_bytes, group.rank * block_bytes};
    return launchSteps(group, algo, kDirectSteps, seq, signature, total, result, stream, kWhat);
}

}  // namespace mooncake::pg::device
