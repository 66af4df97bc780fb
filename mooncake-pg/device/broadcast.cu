#include "mooncake-pg/device/broadcast.h"

#include <algorithm>
#include <string>

#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

struct BroadcastAlgo {
    char* buffer;
    uint64_t bytes;
    uint64_t chunk;  // bytes per step: the root's whole region
    int root;

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step >= 0 && g.rank != root) {
            const uint64_t off = static_cast<uint64_t>(a.wait_step) * chunk;
            if (off < bytes)
                gridCopy(buffer + off, region(g, root, a.wait_parity), min(chunk, bytes - off));
        }
        if (a.stage_step >= 0 && g.rank == root) {
            const uint64_t off = static_cast<uint64_t>(a.stage_step) * chunk;
            if (off < bytes)
                gridCopy(region(g, root, a.stage_parity), buffer + off, min(chunk, bytes - off));
        }
    }
};

struct ScatterAlgo {
    const char* input;  // the root's, `size` blocks
    char* output;       // this rank's block
    uint64_t bytes;     // per block
    uint64_t total;     // size * bytes
    uint64_t chunk;     // bytes per step: the root's whole region
    int root;

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        const uint64_t mine = static_cast<uint64_t>(g.rank) * bytes;
        if (a.wait_step >= 0 && g.rank != root) {
            const uint64_t off = static_cast<uint64_t>(a.wait_step) * chunk;
            const uint64_t lo = max(off, mine);
            const uint64_t hi = min(min(off + chunk, total), mine + bytes);
            if (lo < hi)
                gridCopy(output + (lo - mine), region(g, root, a.wait_parity) + (lo - off),
                         hi - lo);
        }
        if (a.stage_step >= 0 && g.rank == root) {
            const uint64_t off = static_cast<uint64_t>(a.stage_step) * chunk;
            if (off < total)
                gridCopy(region(g, root, a.stage_parity), input + off, min(chunk, total - off));
            if (a.stage_step == 0)
                gridCopy(output, input + mine, bytes);
        }
    }
};

}  // namespace

Status broadcast(const DeviceGroupView& group, void* buffer, size_t count, DataType dtype, int root,
                 uint64_t seq, DeviceOpResult* result, cudaStream_t stream) {
    constexpr const char* kWhat = "device broadcast";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    MC_RETURN_IF_ERROR(checkRoot(group, root, kWhat));
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(checkBuffer(buffer, bytes, "buffer", kWhat));
    BroadcastAlgo algo{static_cast<char*>(buffer), bytes,
                       group.slot_bytes * static_cast<uint64_t>(group.size), root};
    uint64_t steps = 0;
    MC_RETURN_IF_ERROR(stepsFor(divUp(bytes, algo.chunk), 1, kWhat, &steps));
    const uint64_t signature = callSignature(kBroadcastCollective, static_cast<uint8_t>(dtype),
                                             static_cast<uint8_t>(root), count);
    return launchSteps(group, algo, steps, seq, signature, std::min(bytes, algo.chunk), result,
                       stream, kWhat);
}

Status scatter(const DeviceGroupView& group, const void* input, void* output, size_t count,
               DataType dtype, int root, uint64_t seq, DeviceOpResult* result,
               cudaStream_t stream) {
    constexpr const char* kWhat = "device scatter";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    MC_RETURN_IF_ERROR(checkRoot(group, root, kWhat));
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    const uint64_t total = bytes * static_cast<uint64_t>(group.size);
    if (group.rank == root) {
        MC_RETURN_IF_ERROR(checkBuffer(input, total, "input", kWhat));
        if (output != nullptr && rangesOverlap(input, total, output, bytes))
            return InvalidArgument(std::string(kWhat) + ": the root's output overlaps its input");
    }
    MC_RETURN_IF_ERROR(checkBuffer(output, bytes, "output", kWhat));
    ScatterAlgo algo{static_cast<const char*>(input),
                     static_cast<char*>(output),
                     bytes,
                     total,
                     group.slot_bytes * static_cast<uint64_t>(group.size),
                     root};
    uint64_t steps = 0;
    MC_RETURN_IF_ERROR(stepsFor(divUp(total, algo.chunk), 1, kWhat, &steps));
    const uint64_t signature = callSignature(kScatterCollective, static_cast<uint8_t>(dtype),
                                             static_cast<uint8_t>(root), count);
    return launchSteps(group, algo, steps, seq, signature, std::min(total, algo.chunk), result,
                       stream, kWhat);
}

}  // namespace mooncake::pg::device
