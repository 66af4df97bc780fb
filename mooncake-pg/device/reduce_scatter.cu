#include "mooncake-pg/device/reduce_scatter.h"

#include <algorithm>
#include <string>

#include "mooncake-pg/device/grid_reduce.cuh"
#include "mooncake-pg/device/reduce_dispatch.cuh"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

template <typename T, ReduceOp kOp>
struct ReduceScatterAlgo {
    const T* input;
    T* output;
    uint64_t count;  // elements per block
    uint64_t chunk;  // elements per block and step: one slot

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step >= 0) {
            const uint64_t off = static_cast<uint64_t>(a.wait_step) * chunk;
            if (off < count) {
                const uint64_t slot = static_cast<uint64_t>(g.rank) * g.slot_bytes;
                gridReduce<T, kOp>(g, a.wait_parity, slot, input + g.rank * count + off,
                                   output + off, nullptr, min(chunk, count - off));
            }
        }
        if (a.stage_step >= 0) {
            const uint64_t off = static_cast<uint64_t>(a.stage_step) * chunk;
            if (off < count) {
                const uint64_t len = min(chunk, count - off) * sizeof(T);
                char* own = region(g, g.rank, a.stage_parity);
                for (int dst = 0; dst < g.size; ++dst) {
                    if (dst != g.rank)
                        gridCopy(own + dst * g.slot_bytes,
                                 reinterpret_cast<const char*>(input + dst * count + off), len);
                }
            }
        }
    }
};

}  // namespace

Status reduceScatter(const DeviceGroupView& group, const void* input, void* output, size_t count,
                     DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                     cudaStream_t stream) {
    constexpr const char* kWhat = "device reduce_scatter";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    std::string why;
    if (!reduceOpSupported(op, dtype, &why))
        return InvalidArgument(std::string(kWhat) + ": " + why);
    const uint64_t elem = dataTypeSize(dtype);
    const uint64_t bytes = static_cast<uint64_t>(count) * elem;
    MC_RETURN_IF_ERROR(checkBuffer(input, bytes * group.size, "input", kWhat));
    MC_RETURN_IF_ERROR(checkBuffer(output, bytes, "output", kWhat));
    const uint64_t chunk = group.slot_bytes / elem;
    uint64_t steps = 0;
    MC_RETURN_IF_ERROR(stepsFor(divUp(count, chunk), 1, kWhat, &steps));
    const uint64_t signature = callSignature(kReduceScatterCollective, static_cast<uint8_t>(dtype),
                                             static_cast<uint8_t>(op), count);
    const uint64_t grid_bytes = std::min(bytes, group.slot_bytes) * group.size;
    return visitReduce(dtype, op, [&](auto type, auto op_tag) {
        using T = typename decltype(type)::type;
        ReduceScatterAlgo<T, decltype(op_tag)::value> algo{static_cast<const T*>(input),
                                                           static_cast<T*>(output), count, chunk};
        return launchSteps(group, algo, steps, seq, signature, grid_bytes, result, stream, kWhat);
    });
}

}  // namespace mooncake::pg::device
