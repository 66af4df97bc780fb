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
    uintptr_t address_bits;  // every member's input and output address, or-ed (alignment)

    // Rank r reduces piece r of the members' inputs and writes it into every
    // member's output: each byte is read once per input and written once per
    // output, the traffic limit itself, in one pass.
    __device__ void run(const DeviceGroupView& g, const StepArgs& a) const {
        if (a.wait_step != 0)
            return;
        uint64_t lo, hi;
        memberPiece<T>(count, g.size, g.rank, &lo, &hi);
        gridReduceCopiesTo<T, kOp>(g.size, MemberBufferCopies<T>{buffers.inputs, lo},
                                   MemberBufferOutputs<T>{buffers.outputs, lo, g.size},
                                   address_bits | (lo * sizeof(T)), hi - lo);
    }
};

}  // namespace

Status directAllReduce(const DeviceGroupView& group, const MemberBuffers& buffers, size_t count,
                       DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                       cudaStream_t stream, int reduce_root) {
    constexpr const char* kWhat = "device direct all_reduce";
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    MC_RETURN_IF_ERROR(
        checkDirectReduction(group, result, buffers, count, dtype, op, bytes, bytes, true, kWhat));
    // Piece r of an output is written by rank r while the others read their
    // pieces of the inputs: an output that overlaps its input without being
    // it would be read and written by different ranks at once.
    for (int r = 0; r < group.size; ++r) {
        if (buffers.inputs[r] != buffers.outputs[r] &&
            bytesOverlap(buffers.inputs[r], buffers.outputs[r], bytes))
            return InvalidArgument(std::string(kWhat) + ": rank " + std::to_string(r) +
                                   "'s output overlaps its input without being it");
    }
    const uintptr_t address_bits =
        inputAddressBits(buffers, group.size) | outputAddressBits(buffers, group.size);
    MC_RETURN_IF_ERROR(checkReduceRoot(group, reduce_root, kWhat));
    const uint64_t signature =
        callSignature(reductionCollective(true, reduce_root), static_cast<uint8_t>(dtype),
                      static_cast<uint8_t>(op), count);
    return visitReduce(dtype, op, [&](auto type, auto op_tag) {
        using T = typename decltype(type)::type;
        DirectAllReduceAlgo<T, decltype(op_tag)::value> algo{buffers, count, address_bits};
        return launchSteps(group, algo, kDirectSteps, seq, signature, bytes, result, stream, kWhat);
    });
}

}  // namespace mooncake::pg::device
