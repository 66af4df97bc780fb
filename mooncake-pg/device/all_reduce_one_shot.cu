#include "mooncake-pg/device/all_reduce.h"

#include <string>

#include "mooncake-pg/device/launch_checks.h"
#include "mooncake-pg/device/reduce_dispatch.cuh"
#include "mooncake-pg/device/reduce_ops.cuh"
#include "mooncake-pg/device/spin_wait.cuh"
#include "mooncake-pg/device/step_kernel.cuh"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::pg::device {

namespace {

constexpr int kThreads = 512;
// Enough blocks to keep the copy engines of one SM group busy on the reduce;
// one-shot inputs are small.
constexpr int kMaxReduceBlocks = 32;
// Up to this size one block pushes to every member and reduces, in one
// kernel: a launch costs the host about 8 us under MPS (H200, 2026-12-03),
// more than a block takes to copy this much.
constexpr uint64_t kSingleBlockBytes = 16 << 10;

__device__ __forceinline__ bool callIsCurrent(const DeviceGroupView& g, uint64_t tag,
                                              DeviceOpResult* result) {
    const uint64_t epoch_seen = *g.current_epoch;
    return hostWordsAllow(g, epoch_seen, *g.abort_word, result, failWordOf(g, tag), -1);
}

// The call's one step: its number (callSeq), tag and parity, worked out on
// the device by every kernel of the call.
struct OneShotStep {
    uint64_t seq;
    uint64_t tag;
    int parity;
};

__device__ __forceinline__ OneShotStep oneShotStep(const DeviceGroupView& g, uint64_t host_seq) {
    const uint64_t seq = callSeq(g, host_seq);
    return OneShotStep{seq, stepTag(g.epoch, seq, 0), stepParity(seq, 0)};
}

// Every thread of the block: the call's one step waited for at every member
// (flag and signature, as the step kernels do); false when the call failed.
__device__ __forceinline__ bool waitMembers(const DeviceGroupView& g, const OneShotStep& step,
                                            uint64_t signature, DeviceOpResult* result) {
    StepArgs a;
    a.wait_step = 0;
    a.wait_parity = step.parity;
    a.wait_tag = step.tag;
    a.signature = signature;
    a.call_tag = step.tag;
    return blockWaitStep(g, a, result);
}

// output[i] = the members' slots of element i combined, grid-stride.
template <typename T, ReduceOp kOp>
__device__ __forceinline__ void reduceSlots(const DeviceGroupView& g, T* output, uint64_t count,
                                            int parity) {
    const char* own = g.windows[g.rank];
    const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
        T acc = reinterpret_cast<const T*>(own + slotOffset(parity, 0, g.size, g.slot_bytes))[i];
        for (int src = 1; src < g.size; ++src) {
            const T* slot =
                reinterpret_cast<const T*>(own + slotOffset(parity, src, g.size, g.slot_bytes));
            acc = combine<T, kOp>(acc, slot[i]);
        }
        if constexpr (kOp == ReduceOp::kAvg)
            acc = divideBy(acc, g.size);
        output[i] = acc;
    }
}

// Block b copies the input into this rank's slot at member b, then publishes
// the signature and raises the flag there.
__global__ void pushKernel(DeviceGroupView g, const char* input, uint64_t bytes, uint64_t seq,
                           uint64_t signature, DeviceOpResult* result) {
    const OneShotStep step = oneShotStep(g, seq);
    const int parity = step.parity;
    __shared__ bool current;
    if (threadIdx.x == 0)
        current = callIsCurrent(g, step.tag, result);
    __syncthreads();
    if (!current)
        return;
    const int dst = blockIdx.x;
    char* window = g.windows[dst];
    char* slot = window + slotOffset(parity, g.rank, g.size, g.slot_bytes);
    const bool aligned =
        ((reinterpret_cast<uintptr_t>(input) | reinterpret_cast<uintptr_t>(slot)) & 15) == 0;
    const uint64_t vectors = aligned ? bytes / 16 : 0;
    const int4* in4 = reinterpret_cast<const int4*>(input);
    int4* out4 = reinterpret_cast<int4*>(slot);
    for (uint64_t i = threadIdx.x; i < vectors; i += blockDim.x)
        out4[i] = in4[i];
    for (uint64_t i = vectors * 16 + threadIdx.x; i < bytes; i += blockDim.x)
        slot[i] = input[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        *reinterpret_cast<volatile uint64_t*>(window + signatureOffset(parity, g.rank)) = signature;
        // The fence makes every thread's slot stores (ordered before it by the
        // barrier) and the signature visible before the flag.
        __threadfence_system();
        storeReleaseSys(reinterpret_cast<uint64_t*>(window + flagOffset(parity, g.rank)), step.tag);
    }
}

// The call's last kernel: every block arrives, failed or not, so that the
// last one advances the call counter.
template <typename T, ReduceOp kOp>
__global__ void waitReduceKernel(DeviceGroupView g, T* output, uint64_t count, uint64_t seq,
                                 uint64_t signature, DeviceOpResult* result) {
    const OneShotStep step = oneShotStep(g, seq);
    if (waitMembers(g, step, signature, result))
        reduceSlots<T, kOp>(g, output, count, step.parity);
    StepArgs end;
    end.seq = step.seq;
    end.ends_call = true;
    end.call_tag = step.tag;
    blockArrive(g, end, result);
}

// The whole block: this rank's input into its slot at every member, the
// flags, every member's flag and signature, then the reduction into output.
template <typename T, ReduceOp kOp>
__device__ __forceinline__ void pushWaitReduce(const DeviceGroupView& g, const char* input,
                                               T* output, uint64_t count, const OneShotStep& step,
                                               uint64_t signature, DeviceOpResult* result) {
    for (int dst = 0; dst < g.size; ++dst)
        gridCopy(g.windows[dst] + slotOffset(step.parity, g.rank, g.size, g.slot_bytes), input,
                 count * sizeof(T));
    // Every read of the input is done before any write of the output (they
    // may be one buffer), and every slot store before the flags.
    __syncthreads();
    if (threadIdx.x < static_cast<unsigned>(g.size)) {
        char* window = g.windows[threadIdx.x];
        *reinterpret_cast<volatile uint64_t*>(window + signatureOffset(step.parity, g.rank)) =
            signature;
        __threadfence_system();
        storeReleaseSys(reinterpret_cast<uint64_t*>(window + flagOffset(step.parity, g.rank)),
                        step.tag);
    }
    if (waitMembers(g, step, signature, result))
        reduceSlots<T, kOp>(g, output, count, step.parity);
}

// The single-kernel call: pushed and reduced by one block.
template <typename T, ReduceOp kOp>
__global__ void singleBlockOneShotKernel(DeviceGroupView g, const char* input, T* output,
                                         uint64_t count, uint64_t seq, uint64_t signature,
                                         DeviceOpResult* result) {
    const OneShotStep step = oneShotStep(g, seq);
    __shared__ bool ok;
    if (threadIdx.x == 0)
        ok = callIsCurrent(g, step.tag, result);
    __syncthreads();
    if (ok)
        pushWaitReduce<T, kOp>(g, input, output, count, step, signature, result);
    // Every thread read the call counter, and wrote its part of the output,
    // before this barrier.
    __syncthreads();
    if (threadIdx.x == 0) {
        advanceCallSeq(g, step.seq);
        markCallEnded(result);
    }
}

template <typename T, ReduceOp kOp>
void launchReduce(const DeviceGroupView& g, void* output, uint64_t count, uint64_t seq,
                  uint64_t signature, DeviceOpResult* result, cudaStream_t stream) {
    uint64_t blocks = (count + kThreads - 1) / kThreads;
    if (blocks < 1)
        blocks = 1;
    if (blocks > kMaxReduceBlocks)
        blocks = kMaxReduceBlocks;
    waitReduceKernel<T, kOp><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        g, static_cast<T*>(output), count, seq, signature, result);
}

}  // namespace

Status oneShotAllReduce(const DeviceGroupView& group, const void* input, void* output, size_t count,
                        DataType dtype, ReduceOp op, uint64_t seq, DeviceOpResult* result,
                        cudaStream_t stream, int reduce_root) {
    MC_RETURN_IF_ERROR(checkGroup(group));
    std::string why;
    if (!reduceOpSupported(op, dtype, &why))
        return InvalidArgument(why);
    if (!result)
        return InvalidArgument("oneShotAllReduce needs a result word");
    const uint64_t bytes = static_cast<uint64_t>(count) * dataTypeSize(dtype);
    if (bytes > group.slot_bytes) {
        return InvalidArgument("one-shot all_reduce of " + std::to_string(bytes) +
                               " bytes does not fit a " + std::to_string(group.slot_bytes) +
                               "-byte slot");
    }
    MC_RETURN_IF_ERROR(checkReduceRoot(group, reduce_root, "one-shot all_reduce"));
    const uint64_t signature =
        callSignature(reductionCollective(false, reduce_root), static_cast<uint8_t>(dtype),
                      static_cast<uint8_t>(op), count);
    if (bytes <= kSingleBlockBytes) {
        MC_RETURN_IF_ERROR(visitReduce(dtype, op, [&](auto type, auto op_tag) {
            using T = typename decltype(type)::type;
            singleBlockOneShotKernel<T, decltype(op_tag)::value><<<1, kThreads, 0, stream>>>(
                group, static_cast<const char*>(input), static_cast<T*>(output), count, seq,
                signature, result);
            return Status::OK();
        }));
        return cudaLaunchStatus("one-shot all_reduce");
    }
    pushKernel<<<group.size, kThreads, 0, stream>>>(group, static_cast<const char*>(input), bytes,
                                                    seq, signature, result);
    MC_RETURN_IF_ERROR(visitReduce(dtype, op, [&](auto type, auto op_tag) {
        using T = typename decltype(type)::type;
        launchReduce<T, decltype(op_tag)::value>(group, output, count, seq, signature, result,
                                                 stream);
        return Status::OK();
    }));
    return cudaLaunchStatus("one-shot all_reduce");
}

}  // namespace mooncake::pg::device
