#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/launch_checks.h"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct DirectAllToAllAlgo {
    MemberBuffers buffers;
    uint64_t block_bytes;

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step != 0)
            return;
        char* own = static_cast<char*>(buffers.outputs[g.rank]);
        const uint64_t mine = static_cast<uint64_t>(g.rank) * block_bytes;
        for (int src = 0; src < g.size; ++src) {
            gridCopy(own + src * block_bytes, static_cast<const char*>(buffers.inputs[src]) + mine,
                     block_bytes);
        }
    }
};

}  // namespace

Status directAllToAll(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                      DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device direct all_to_all";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    const uint64_t block_bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    const uint64_t total = block_bytes * group.size;
    MC_RETURN_IF_ERROR(checkMemberBuffers(group, buffers, total, total, false, kWhat));
    const char* in = static_cast<const char*>(buffers.inputs[group.rank]);
    const char* out = static_cast<const char*>(buffers.outputs[group.rank]);
    if (in < out + total && out < in + total)
        return InvalidArgument(std::string(kWhat) + ": the output overlaps the input");
    const uint64_t signature =
        callSignature(kDirectAllToAllCollective, static_cast<uint8_t>(dtype), 0, count);
    const DirectAllToAllAlgo algo{buffers, block_bytes};
    return launchSteps(group, algo, kDirectSteps, seq, signature, total, result, stream, kWhat);
}

}  // namespace mooncake::pg::device
