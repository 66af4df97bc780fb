#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/launch_checks.h"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct DirectAllGatherAlgo {
    MemberBuffers buffers;
    uint64_t bytes;  // per member

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step != 0)
            return;
        char* own = static_cast<char*>(buffers.outputs[g.rank]);
        for (int src = 0; src < g.size; ++src)
            gridCopy(own + src * bytes, static_cast<const char*>(buffers.inputs[src]), bytes);
    }
};

}  // namespace

Status directAllGather(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                       DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device direct all_gather";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(checkMemberBuffers(group, buffers, bytes, bytes * group.size, false, kWhat));
    const uint64_t signature =
        callSignature(kDirectAllGatherCollective, static_cast<uint8_t>(dtype), 0, count);
    const DirectAllGatherAlgo algo{buffers, bytes};
    return launchSteps(group, algo, kDirectSteps, seq, signature, bytes * group.size, result,
                       stream, kWhat);
}

}  // namespace mooncake::pg::device
