#include "mooncake-pg/device/all_to_all.h"

#include <algorithm>

#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct AllToAllAlgo {
    const char* input;
    char* output;
    uint64_t bytes;  // per block

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        const uint64_t chunk = g.slot_bytes;
        const uint64_t me = static_cast<uint64_t>(g.rank);
        if (a.wait_step >= 0) {
            const uint64_t off = static_cast<uint64_t>(a.wait_step) * chunk;
            if (off < bytes) {
                const uint64_t len = min(chunk, bytes - off);
                for (int src = 0; src < g.size; ++src) {
                    if (src != g.rank)
                        gridCopy(output + src * bytes + off,
                                 region(g, src, a.wait_parity) + me * g.slot_bytes, len);
                }
            }
        }
        if (a.stage_step >= 0) {
            const uint64_t off = static_cast<uint64_t>(a.stage_step) * chunk;
            if (off < bytes) {
                const uint64_t len = min(chunk, bytes - off);
                char* own = region(g, g.rank, a.stage_parity);
                for (int dst = 0; dst < g.size; ++dst) {
                    if (dst != g.rank)
                        gridCopy(own + dst * g.slot_bytes, input + dst * bytes + off, len);
                }
                gridCopy(output + me * bytes + off, input + me * bytes + off, len);
            }
        }
    }
};

}  // namespace

Status allToAll(const DeviceGroupView& group, const void* input, void* output, size_t count,
                DataType dtype, uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device all_to_all";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(checkBuffer(input, bytes * group.size, "input", kWhat));
    MC_RETURN_IF_ERROR(checkBuffer(output, bytes * group.size, "output", kWhat));
    AllToAllAlgo algo{static_cast<const char*>(input), static_cast<char*>(output), bytes};
    uint64_t steps = 0;
    MC_RETURN_IF_ERROR(stepsFor(divUp(bytes, group.slot_bytes), 1, kWhat, &steps));
    const uint64_t signature =
        callSignature(kAllToAllCollective, static_cast<uint8_t>(dtype), 0, count);
    return launchSteps(group, algo, steps, seq, signature,
                       std::min(bytes, group.slot_bytes) * group.size, result, stream, kWhat);
}

}  // namespace mooncake::pg::device
