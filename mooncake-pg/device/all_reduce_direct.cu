#include <string>

#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/grid_reduce.cuh"
#include "mooncake-pg/device/reduce_dispatch.cuh"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

template <typename T, ReduceOp kOp>
struct DirectAllReduceAlgo {
    MemberBuffers buffers;
    uint64_t count;
    uintptr_t input_bits;  // every member's input address, or-ed (alignment)

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        uint64_t lo, hi;
        T* own = static_cast<T*>(buffers.outputs[g.rank]);
        if (a.wait_step == 0) {
            memberPiece<T>(count, g.size, g.rank, &lo, &hi);
            gridReduceCopies<T, kOp>(g.size, MemberBufferCopies<T>{buffers.inputs, lo},
                                     input_bits | (lo * sizeof(T)), own + lo, nullptr, hi - lo);
        } else if (a.wait_step == 1) {
            for (int src = 0; src < g.size; ++src) {
                if (src == g.rank)
                    continue;
                memberPiece<T>(count, g.size, src, &lo, &hi);
                const char* theirs = static_cast<const char*>(buffers.outputs[src]);
                gridCopy(reinterpret_cast<char*>(own + lo), theirs + lo * sizeof(T),
                         (hi - lo) * sizeof(T));
            }
        }
    }
};

}  // namespace

Status directAllReduce(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                       DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                       cudaStream_t stream) {
    constexpr const char* kWhat = "device direct all_reduce";
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(
        checkDirectReduction(group, result, buffers, count, dtype, op, bytes, bytes, true, kWhat));
    const uintptr_t input_bits = inputAddressBits(buffers, group.size);
    const uint64_t signature = callSignature(
        kDirectAllReduceCollective, static_cast<uint8_t>(dtype), static_cast<uint8_t>(op), count);
    return visitReduce(dtype, op, [&](auto type, auto op_tag) {
        using T = typename decltype(type)::type;
        DirectAllReduceAlgo<T, decltype(op_tag)::value> algo{buffers, count, input_bits};
        return launchSteps(group, algo, kDirectSteps, seq, signature, bytes, result, stream, kWhat);
    });
}

}  // namespace mooncake::pg::device
