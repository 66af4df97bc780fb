// The send kernels of dispatch and combine for IBGDA peers (see
// ibgda_kernels.h); the receive kernels are cuda_ipc's, because the data and
// the signal words land in the local buffer the same way. Peers with an
// entry in the peer table are written with loads/stores exactly as in
// kernels/dispatch.cu and kernels/combine.cu.
#include "mooncake-ep/ibgda/ibgda_kernels.h"

#include <string>

#include "mooncake-ep/kernels/ep_blocks.cuh"
#include "mooncake-transfer-engine/common/cuda_launch.h"

namespace mooncake::ep {
namespace {

constexpr int kSendThreads = 512;

struct DispatchParams {
    IbgdaEpDevice d;
    EpGroupArgs g;
    DispatchArgs a;
};

struct CombineParams {
    IbgdaEpDevice d;
    EpGroupArgs g;
    CombineArgs a;
};

struct DeviceClock {
    __device__ int64_t operator()() const { return static_cast<int64_t>(globalTimerNs()); }
};

__device__ int64_t deadlineAfter(int64_t timeout_ns) {
    return timeout_ns < 0 ? -1 : DeviceClock{}() + timeout_ns;
}

// The QP of the traffic of a send block to `dst`: blocks are spread over the
// peer's QPs by local expert, and a block's data and signal share one QP,
// which the ordering of the signal after the data needs.
__device__ IbgdaChannel* channelFor(const IbgdaEpDevice& d, int dst, int local_expert) {
    return &d.channels[static_cast<int64_t>(dst) * d.qps_per_rank + local_expert % d.qps_per_rank];
}

__device__ uint64_t stagingAddress(const char* p) {
    return reinterpret_cast<uint64_t>(p);
}

// Thread 0 of a send block: `length` staged bytes at `staged` to
// `remote_offset` of dst's buffer (none when 0), then the fetch-add that
// raises the signal word at `word_offset` to epMakeSignal(seq, payload), then
// the wait for the QP to drain, all by the block's `deadline`. `shadow`
// holds what this rank has added to that word so far. Any failure marks dst
// inactive.
__device__ void postAndSignal(const IbgdaEpDevice& d, const EpGroupArgs& g, IbgdaChannel* ch,
                              int dst, uint64_t* shadow, const char* staged, int64_t remote_offset,
                              int64_t length, int64_t word_offset, uint64_t seq, uint32_t payload,
                              int64_t deadline) {
    const uint64_t value = epMakeSignal(seq, payload);
    const mlx5q::PutWithCount p = ibgdaSignalPut(d, dst, stagingAddress(staged), remote_offset,
                                                 length, word_offset, *shadow, value);
    IbgdaStatus st = ibgdaPutWithCount(ch, p, deadline, DeviceClock{});
    if (st == IbgdaStatus::kOk) {
        *shadow = value;  // in the ring: the NIC adds it unless the QP fails for good
        st = ibgdaQuiet(ch, deadline, DeviceClock{});
    }
    if (st != IbgdaStatus::kOk)
        atomicExch(&g.active_ranks[dst], 0);
}

__global__ void __launch_bounds__(kSendThreads) ibgdaDispatchSend(DispatchParams p) {
    const EpLayout L = epLayoutOf(p.g);
    const EpSendBlock b = epDispatchSendBlock(p.g, L);
    if (b.expert == 0)
        epCheckExpertIds(p.g, p.a, epState(p.g.local_buffer));
    if (!b.active(p.g))
        return;
    char* mapped = static_cast<char*>(p.g.peer_buffers[b.dst]);  // null: over IBGDA
    char* block_staging = p.d.staging + IbgdaStagingLayout{L}.dispatchBlockOffset(b.expert);
    char* staged = block_staging + kIbgdaShadowBytes;
    const int64_t first_slot = L.dispatchMessageOffset(b.phase, b.local_expert, p.g.rank, 0);
    const int sent =
        epForEachSelected<kSendThreads>(p.a, b.expert, [&](int slot, int token, int lane) {
            char* msg = (mapped ? mapped + first_slot : staged) + slot * L.messageBytes();
            epWriteMessage(p.g, p.a, L, token, msg, lane);
        });
    __syncthreads();  // every message staged (epForEachSelected may not meet with none)
    if (threadIdx.x != 0)
        return;
    const int64_t word = L.dispatchCountOffset(b.phase, b.local_expert, p.g.rank);
    if (mapped) {
        epSignal(reinterpret_cast<uint64_t*>(mapped + word), b.seq, static_cast<uint32_t>(sent));
        return;
    }
    __threadfence_system();  // the staged messages, before the NIC reads them
    postAndSignal(p.d, p.g, channelFor(p.d, b.dst, b.local_expert), b.dst,
                  reinterpret_cast<uint64_t*>(block_staging) + b.phase, staged, first_slot,
                  static_cast<int64_t>(sent) * L.messageBytes(), word, b.seq,
                  static_cast<uint32_t>(sent), deadlineAfter(p.g.timeout_ns));
}

__global__ void __launch_bounds__(kSendThreads) ibgdaCombineSend(CombineParams p) {
    const EpLayout L = epLayoutOf(p.g);
    const EpSendBlock b = epCombineSendBlock(p.g, L);
    if (!b.active(p.g))
        return;
    char* mapped = static_cast<char*>(p.g.peer_buffers[b.dst]);
    const int64_t row_bytes = p.g.hidden * 2;
    char* block_staging =
        p.d.staging + IbgdaStagingLayout{L}.combineBlockOffset(b.local_expert, b.dst);
    char* staged_rows = block_staging + kIbgdaShadowBytes;
    IbgdaChannel* ch = mapped ? nullptr : channelFor(p.d, b.dst, b.local_expert);
    const int64_t deadline = deadlineAfter(p.g.timeout_ns);
    __shared__ int write_failed;
    if (threadIdx.x == 0)
        write_failed = 0;
    __syncthreads();
    int64_t begin = 0;
    const int64_t count = epForEachCombineRow<kSendThreads>(
        p.g, p.a, b,
        [&](int64_t i, int64_t x_row, int token, int lane) {
            char* row = mapped ? mapped + L.combineRowOffset(b.phase, b.expert, token)
                               : staged_rows + i * row_bytes;
            epCopyExpertRow(p.g, p.a, x_row, row, lane);
        },
        &begin);
    constexpr int kWarps = kSendThreads / 32;
    const int warp = threadIdx.x / 32;
    __syncwarp();  // the warp's rows are staged, for its lane 0 to post
    if (!mapped && threadIdx.x % 32 == 0 && count > warp) {
        // Lane 0 queues the WRITEs of its warp's rows (i = warp, warp +
        // kWarps, ...) in one turn of the channel's lock.
        __threadfence_system();  // the warp's staged rows, before the NIC reads them
        const int n = static_cast<int>((count - warp + kWarps - 1) / kWarps);
        const IbgdaStatus st = ibgdaWriteMany(
            ch, n, p.d.staging_lkey, p.d.rkeys[b.dst],
            [&](int j, uint64_t* local, uint64_t* remote, uint32_t* bytes) {
                const int64_t i = warp + static_cast<int64_t>(j) * kWarps;
                int64_t x_row = 0;
                const int token = epCombineRowToken(p.g, p.a, b, begin, i, &x_row);
                if (token < 0)
                    return false;
                *local = stagingAddress(staged_rows + i * row_bytes);
                *remote = p.d.remote_bases[b.dst] +
                          static_cast<uint64_t>(L.combineRowOffset(b.phase, b.expert, token));
                *bytes = static_cast<uint32_t>(row_bytes);
                return true;
            },
            deadline, DeviceClock{});
        if (st != IbgdaStatus::kOk)
            atomicExch(&write_failed, 1);
    }
    __syncthreads();  // every row written or queued before the signal
    if (threadIdx.x != 0)
        return;
    const int64_t word = L.combineFlagOffset(b.phase, b.expert);
    if (mapped) {
        epSignal(reinterpret_cast<uint64_t*>(mapped + word), b.seq, static_cast<uint32_t>(count));
        return;
    }
    if (write_failed) {
        atomicExch(&p.g.active_ranks[b.dst], 0);
        // Best effort: the rows other warps queued go now, not with a later
        // doorbell that could find this staging rewritten by the next op.
        (void)ibgdaQuiet(ch, deadline, DeviceClock{});
        return;
    }
    postAndSignal(p.d, p.g, ch, b.dst, reinterpret_cast<uint64_t*>(block_staging) + b.phase,
                  nullptr, 0, 0, word, b.seq, static_cast<uint32_t>(count), deadline);
}

}  // namespace

Status checkIbgdaArgs(const IbgdaEpDevice& d, const EpGroupArgs& g) {
    MC_RETURN_IF_ERROR(checkGroupArgs(g));
    if (!d.channels || !d.remote_bases || !d.rkeys || !d.staging)
        return InvalidArgument("IBGDA: the transport's device tables are not set up");
    if (d.qps_per_rank < 1)
        return InvalidArgument("IBGDA: qps_per_rank=" + std::to_string(d.qps_per_rank) +
                               "; expected at least 1");
    const EpLayout L = epLayoutOf(g);
    const int64_t need = IbgdaStagingLayout{L}.totalBytes();
    if (need > static_cast<int64_t>(d.staging_bytes))
        return InvalidArgument("IBGDA: this layout (num_experts=" + std::to_string(g.num_experts) +
                               ", max_tokens=" + std::to_string(g.max_tokens) + ", hidden=" +
                               std::to_string(g.hidden) + ") stages " + std::to_string(need) +
                               " bytes; the staging holds " + std::to_string(d.staging_bytes));
    const int64_t largest_write = g.max_tokens * L.messageBytes();
    if (largest_write > kIbgdaMaxWriteBytes)
        return InvalidArgument("IBGDA: max_tokens=" + std::to_string(g.max_tokens) +
                               " with hidden=" + std::to_string(g.hidden) + " makes one WRITE of " +
                               std::to_string(largest_write) + " bytes; expected below 2^31");
    return Status::OK();
}

Status launchIbgdaDispatch(const IbgdaEpDevice& d, const EpGroupArgs& g, const DispatchArgs& a,
                           cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkDispatchArgs(g, a));
    MC_RETURN_IF_ERROR(checkIbgdaArgs(d, g));
    const DispatchParams p{d, g, a};
    ibgdaDispatchSend<<<g.num_experts, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("IBGDA dispatch send"));
    return launchDispatchReceive(g, a, stream);
}

Status launchIbgdaCombine(const IbgdaEpDevice& d, const EpGroupArgs& g, const CombineArgs& a,
                          cudaStream_t stream) {
    MC_RETURN_IF_ERROR(checkCombineArgs(g, a));
    MC_RETURN_IF_ERROR(checkIbgdaArgs(d, g));
    const CombineParams p{d, g, a};
    const int nle = g.num_experts / g.num_ranks;
    ibgdaCombineSend<<<nle * g.num_ranks, kSendThreads, 0, stream>>>(p);
    MC_RETURN_IF_ERROR(cudaLaunchStatus("IBGDA combine send"));
    return launchCombineReceive(g, a, stream);
}

}  // namespace mooncake::ep
