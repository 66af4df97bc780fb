#include "mooncake-pg/device/all_gather.h"

#include <algorithm>

#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct AllGatherAlgo {
    const char* input;
    char* output;
    uint64_t bytes;  // per member
    uint64_t chunk;  // bytes per step: this rank's whole region
    bool copies_out;  // false on a gather's non-roots: they only stage

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step >= 0 && copies_out) {
            const uint64_t off = static_cast<uint64_t>(a.wait_step) * chunk;
            if (off < bytes) {
                const uint64_t len = min(chunk, bytes - off);
                for (int src = 0; src < g.size; ++src)
                    gridCopy(output + src * bytes + off, region(g, src, a.wait_parity), len);
            }
        }
        if (a.stage_step >= 0) {
            const uint64_t off = static_cast<uint64_t>(a.stage_step) * chunk;
            if (off < bytes)
                gridCopy(region(g, g.rank, a.stage_parity), input + off, min(chunk, bytes - off));
        }
    }
};

// The window steps of all_gather (`root` < 0) and of gather to `root`.
Status launchGatherSteps(const DeviceGroupView& group, const void* input, void* output,
                         size_t count, DataType dtype, int root, uint64_t seq,
                         DeviceOpResult* result, cudaStream_t stream, const char* what) {
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, what));
    MC_RETURN_IF_ERROR(checkCount(count, what));
    const bool copies_out = root < 0 || root == group.rank;
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(checkBuffer(input, bytes, "input", what));
    if (copies_out)
        MC_RETURN_IF_ERROR(checkBuffer(output, bytes, "output", what));
    AllGatherAlgo algo{static_cast<const char*>(input), static_cast<char*>(output), bytes,
                       group.slot_bytes * static_cast<uint64_t>(group.size), copies_out};
    uint64_t steps = 0;
    MC_RETURN_IF_ERROR(stepsFor(divUp(bytes, algo.chunk), 1, what, &steps));
    const uint64_t signature =
        root < 0 ? callSignature(kAllGatherCollective, static_cast<uint8_t>(dtype), 0, count)
                 : callSignature(kGatherCollective, static_cast<uint8_t>(dtype),
                                 static_cast<uint8_t>(root), count);
    return launchSteps(group, algo, steps, seq, signature,
                       std::min(bytes, algo.chunk) * static_cast<uint64_t>(group.size), result,
                       stream, what);
}

}  // namespace

Status allGather(const DeviceGroupView& group, const void* input, void* output, size_t count,
                 DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    return launchGatherSteps(group, input, output, count, dtype, -1, seq, result, stream,
                             "device all_gather");
}

Status gather(const DeviceGroupView& group, const void* input, void* output, size_t count,
              DataType dtype, int root, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device gather";
    MC_RETURN_IF_ERROR(checkRoot(group, root, kWhat));
    return launchGatherSteps(group, input, output, count, dtype, root, seq, result, stream, kWhat);
}

}  // namespace mooncake::pg::device
