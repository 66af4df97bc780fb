#include <algorithm>
#include <string>

#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/grid_reduce.cuh"
#include "mooncake-pg/device/reduce_dispatch.cuh"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

// Chunk c is steps 2c (reduce-scatter) and 2c + 1 (all-gather).
template <typename T, ReduceOp kOp>
struct TwoShotAlgo {
    const T* input;
    T* output;
    uint64_t count;
    uint64_t chunk;  // elements per chunk: size * (slot_bytes / sizeof(T))

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step >= 0) {
            const uint64_t base = static_cast<uint64_t>(a.wait_step / 2) * chunk;
            if (base < count) {
                const uint64_t len = min(chunk, count - base);
                uint64_t lo, hi;
                if (a.wait_step % 2 == 0) {
                    memberPiece<T>(len, g.size, g.rank, &lo, &hi);
                    T* staged = reinterpret_cast<T*>(region(g, g.rank, 1 - a.wait_parity)) + lo;
                    gridReduce<T, kOp>(g, a.wait_parity, lo * sizeof(T), input + base + lo,
                                       output + base + lo, staged, hi - lo);
                } else {
                    for (int src = 0; src < g.size; ++src) {
                        if (src == g.rank)
                            continue;
                        memberPiece<T>(len, g.size, src, &lo, &hi);
                        gridCopy(reinterpret_cast<char*>(output + base + lo),
                                 region(g, src, a.wait_parity) + lo * sizeof(T),
                                 (hi - lo) * sizeof(T));
                    }
                }
            }
        }
        // The all-gather step's data is staged by the reduce above.
        if (a.stage_step >= 0 && a.stage_step % 2 == 0) {
            const uint64_t base = static_cast<uint64_t>(a.stage_step / 2) * chunk;
            if (base < count) {
                const uint64_t len = min(chunk, count - base);
                uint64_t lo, hi;
                memberPiece<T>(len, g.size, g.rank, &lo, &hi);
                char* own = region(g, g.rank, a.stage_parity);
                const char* in = reinterpret_cast<const char*>(input + base);
                gridCopy(own, in, lo * sizeof(T));
                gridCopy(own + hi * sizeof(T), in + hi * sizeof(T), (len - hi) * sizeof(T));
            }
        }
    }
};

}  // namespace

Status twoShotAllReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                        DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                        cudaStream_t stream, int reduce_root) {
    constexpr const char* kWhat = "device two-shot all_reduce";
    MC_RETURN_IF_ERROR(checkChunkedCall(group, result, kWhat));
    MC_RETURN_IF_ERROR(checkCount(count, kWhat));
    std::string why;
    if (!reduceOpSupported(op, dtype, &why))
        return InvalidArgument(std::string(kWhat) + ": " + why);
    const uint64_t elem = dataTypeSize(dtype);
    const uint64_t bytes = static_cast<uint64_t>(count) * elem;
    MC_RETURN_IF_ERROR(checkBuffer(input, bytes, "input", kWhat));
    MC_RETURN_IF_ERROR(checkBuffer(output, bytes, "output", kWhat));
    const uint64_t chunk = group.slot_bytes / elem * group.size;
    uint64_t steps = 0;
    MC_RETURN_IF_ERROR(stepsFor(divUp(count, chunk), 2, kWhat, &steps));
    MC_RETURN_IF_ERROR(checkReduceRoot(group, reduce_root, kWhat));
    const uint64_t signature =
        callSignature(reductionCollective(false, reduce_root), static_cast<uint8_t>(dtype),
                      static_cast<uint8_t>(op), count);
    const uint64_t grid_bytes = std::min(bytes, chunk * elem);
    return visitReduce(dtype, op, [&](auto type, auto op_tag) {
        using T = typename decltype(type)::type;
        TwoShotAlgo<T, decltype(op_tag)::value> algo{static_cast<const T*>(input),
                                                     static_cast<T*>(output), count, chunk};
        return launchSteps(group, algo, steps, seq, signature, grid_bytes, result, stream, kWhat);
    });
}

Status allReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                 DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                 cudaStream_t stream, int reduce_root) {
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    if (bytes <= kOneShotMaxBytes && bytes <= group.slot_bytes) {
        return oneShotAllReduce(group, input, output, count, dtype, op, seq, result, stream,
                                reduce_root);
    }
    return twoShotAllReduce(group, input, output, count, dtype, op, seq, result, stream,
                            reduce_root);
}

Status checkReduceRoot(const DeviceGroupView& group, int reduce_root, const char* what) {
    if (reduce_root < -1 || reduce_root >= group.size)
        return InvalidArgument(std::string(what) + ": reduce root " + std::to_string(reduce_root) +
                               " is not a rank of the group of " + std::to_string(group.size) +
                               " (or -1 for an all_reduce)");
    return Status::OK();
}

}  // namespace mooncake::pg::device
