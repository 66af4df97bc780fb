#include <string>

#include "mooncake-pg/device/grid_reduce.cuh"
#include "mooncake-pg/device/reduce_dispatch.cuh"
#include "mooncake-pg/device/reduce_scatter.h"
#include "mooncake-pg/device/step_kernel.cuh"

namespace mooncake::pg::device {

namespace {

template <typename T, ReduceOp kOp>
struct DirectReduceScatterAlgo {
    MemberBuffers buffers;
    uint64_t count;        // elements per block
    uintptr_t input_bits;  // every member's input address, or-ed (alignment)

    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step != 0)
            return;
        const uint64_t lo = static_cast<uint64_t>(g.rank) * count;
        gridReduceCopies<T, kOp>(g.size, MemberBufferCopies<T>{buffers.inputs, lo},
                                 input_bits | (lo * sizeof(T)),
                                 static_cast<T*>(buffers.outputs[g.rank]), nullptr, count);
    }
};

}  // namespace

Status directReduceScatter(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                           DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                           cudaStream_t stream) {
    constexpr const char* kWhat = "device direct reduce_scatter";
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(checkDirectReduction(group, result, buffers, count, dtype, op,
                                            bytes * group.size, bytes, false, kWhat));
    const uintptr_t input_bits = inputAddressBits(buffers, group.size);
    const uint64_t signature =
        callSignature(kDirectReduceScatterCollective, static_cast<uint8_t>(dtype),
                      static_cast<uint8_t>(op), count);
    return visitReduce(dtype, op, [&](auto type, auto op_tag) {
        using T = typename decltype(type)::type;
        DirectReduceScatterAlgo<T, decltype(op_tag)::value> algo{buffers, count, input_bits};
        return launchSteps(group, algo, kDirectSteps, seq, signature, bytes * group.size, result,
                           stream, kWhat);
    });
}

}  // namespace mooncake::pg::device
