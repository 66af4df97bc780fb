// The direct all_to_all with split sizes (all_to_all_v.h): each rank pulls
// its block of every member's input into its output, per the plan that
// planAllToAllV bounded on the host. Three steps, no window copies.
#include <string>

#include "mooncake-pg/device/all_to_all_v.h"
#include "mooncake-pg/device/launch_checks.h"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct DirectPullVAlgo {
    MemberBuffers buffers;
    AllToAllVPlan plan;

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step != 0)
            return;
        char* own = static_cast<char*>(buffers.outputs[g.rank]);
        for (int src = 0; src < g.size; ++src) {
            gridCopy(own + plan.dst_offset[src],
                     static_cast<const char*>(buffers.inputs[src]) + plan.src_offset[src],
                     plan.bytes[src]);
        }
    }
};

}  // namespace

Status directAllToAllV(const DeviceGroupView& group, const MemberBuffers& buffers,
                       const AllToAllVPlan& plan, uint64_t input_bytes, uint64_t output_bytes,
                       uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device direct all_to_all with split sizes";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    uint64_t total = 0;
    for (int s = 0; s < group.size; ++s) {
        total += plan.bytes[s];
        // Each member's input matters only for the bytes this rank pulls.
        MC_RETURN_IF_ERROR(checkBuffer(buffers.inputs[s], plan.bytes[s],
                                       ("rank " + std::to_string(s) + "'s input").c_str(), kWhat));
    }
    MC_RETURN_IF_ERROR(checkBuffer(buffers.outputs[group.rank], output_bytes, "output", kWhat));
    const void* in = buffers.inputs[group.rank];
    const void* out = buffers.outputs[group.rank];
    if (in && out && rangesOverlap(in, input_bytes, out, output_bytes))
        return InvalidArgument(std::string(kWhat) + ": the output overlaps the input");
    const uint64_t signature = callSignature(kDirectAllToAllVCollective, 0, 0, plan.fingerprint);
    const DirectPullVAlgo algo{buffers, plan};
    return launchSteps(group, algo, kDirectSteps, seq, signature, total, result, stream, kWhat);
}

}  // namespace mooncake::pg::device
