// Host-side policy of the device collectives, with no CUDA or torch headers
// (unit-tested without a GPU): which data path a collective on CUDA tensors
// takes, the settings that choose it, how big a group's device window is,
// and how a kernel's DeviceOpResult becomes the op's Status.
//
// The decision depends only on what every rank of a call agrees on (the
// process-wide path setting, the collective, dtype, op and element count),
// never on a rank's tensor strides or aliasing, so all ranks of a call take
// the same path. The torch layer makes strided or aliased tensors contiguous
// on the communication stream instead.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

// MC_PG_CUDA_PATH: how collectives on CUDA tensors move their data.
//   kernels - the device kernels over cuda_ipc-mapped windows, for the
//             collectives they cover (routeFor); the rest staged (default);
//   staged  - device -> pinned host, the host core, host -> device, for
//             every op.
enum class CudaPath { kStaged, kKernels };
inline constexpr const char* kCudaPathEnv = "MC_PG_CUDA_PATH";
inline constexpr CudaPath kDefaultCudaPath = CudaPath::kKernels;

// `value` null or empty: the default. Anything but "staged"/"kernels": an
// error naming the variable, the value and the accepted ones.
Result<CudaPath> parseCudaPath(const char* value);
const char* cudaPathName(CudaPath path);

// MC_PG_CUDA_SLOT_BYTES: bytes per source slot of a group's device window
// (device_group.h). One-shot all_reduce needs the message to fit a slot, so
// the default is kOneShotMaxBytes (1 MiB); larger messages run in chunks.
inline constexpr const char* kCudaSlotBytesEnv = "MC_PG_CUDA_SLOT_BYTES";
inline constexpr uint64_t kDefaultSlotBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 30;
// A positive multiple of 16 up to kMaxSlotBytes; null or empty: the default.
Result<uint64_t> parseSlotBytes(const char* value);

// MC_PG_CUDA_P2P_POOL_BYTES: the device pool each rank keeps per sender for
// P2P on CUDA tensors (p2p_pools.h), default 16 MiB; messages move through
// it in chunks of p2pChunkBytes. A positive multiple of 4096 up to
// kMaxP2PPoolBytes; the same on every rank (checked when a group is created).
inline constexpr const char* kCudaP2PPoolBytesEnv = "MC_PG_CUDA_P2P_POOL_BYTES";
inline constexpr uint64_t kDefaultP2PPoolBytes = uint64_t{16} << 20;
inline constexpr uint64_t kMaxP2PPoolBytes = uint64_t{1} << 30;
Result<uint64_t> parseP2PPoolBytes(const char* value);
// Up to 4 MiB: four chunks in flight per sender with the default pool, each
// large enough that the host's per-chunk work (an event poll, an ack) stays
// well below the copy's own time.
inline uint64_t p2pChunkBytes(uint64_t pool_bytes) {
    constexpr uint64_t kMaxChunk = uint64_t{4} << 20;
    return pool_bytes < kMaxChunk ? pool_bytes : kMaxChunk;
}

// MC_PG_CUDA_P2P_COPY: how P2P on device pools copies into and out of the
// pools: "memcpy" (default: cudaMemcpyAsync) or "kernel" (a copy kernel,
// copy_bytes.h). Each rank's own choice; true for "kernel".
inline constexpr const char* kCudaP2PCopyEnv = "MC_PG_CUDA_P2P_COPY";
Result<bool> parseP2PCopyWithKernel(const char* value);

// The bytes of one rank's window in a group that reserves `max_group_size`
// slots: the window is allocated once, for every size the group may grow to.
// kInvalidArgument for sizes outside [1, kMaxDeviceRanks].
Result<uint64_t> groupWindowBytes(int max_group_size, uint64_t slot_bytes);

// MC_PG_CUDA_BLOCKING_WAIT: "1": Work::wait() on a kernel call blocks the
// CPU until its kernels have finished and raises their failure (for
// debugging and for scripts that rely on wait() raising); "0", null or
// empty (the default): wait() returns once the kernels are queued, with
// the caller's current stream waiting on them, as NCCL's does.
inline constexpr const char* kCudaBlockingWaitEnv = "MC_PG_CUDA_BLOCKING_WAIT";
Result<bool> parseBlockingWait(const char* value);

// MC_PG_CUDA_DIRECT: "1", null or empty (the default): an all_reduce,
// all_gather, reduce_scatter or all_to_all of kDirectMinBytes and more (the
// larger side) reads the members' own buffers when every member can share
// them (directAllReduce and its kin); "0": they always go through the windows.
// The same on every rank (checked when a group is created).
inline constexpr const char* kCudaDirectEnv = "MC_PG_CUDA_DIRECT";
Result<bool> parseDirect(const char* value);

// MC_PG_CUDA_CALLER_LAUNCH: "1", null or empty (the default): a
// synchronous kernel collective (async_op=False, not captured, smaller than
// kDirectMinBytes, in a membership view the worker already ran one in) is
// launched by the calling thread itself when the group's worker has nothing
// queued or running; "0": every call goes through the worker. Each rank's
// own choice (docs/design/pg-cuda.md).
inline constexpr const char* kCudaCallerLaunchEnv = "MC_PG_CUDA_CALLER_LAUNCH";
Result<bool> parseCallerLaunch(const char* value);

// Kernel calls a group may have queued on its stream before the worker has
// read their results: each holds one result slot of the group window.
inline constexpr int kMaxKernelCallsInFlight = 128;

enum class CudaRoute {
    kHostStaging,  // device -> pinned host, the host core, host -> device
    kKernel,       // a device kernel over the members' mapped windows
};

enum class CudaCollective {
    kAllReduce,
    kAllGather,
    kReduceScatter,
    kAllToAll,   // equal splits
    kAllToAllV,  // split sizes: the direct path only (all_to_all_v.h), else the host
    kBroadcast,
    kReduce,
    kGather,
    kScatter,
};
const char* cudaCollectiveName(CudaCollective c);

struct RouteQuery {
    CudaCollective collective = CudaCollective::kAllReduce;
    DataType dtype = DataType::kFloat32;
    // Reductions only.
    ReduceOp op = ReduceOp::kSum;
    // Elements per rank as the kernel takes them (all_reduce/broadcast: the
    // tensor; all_gather: the input; reduce_scatter: the output; all_to_all:
    // one block; all_to_all with split sizes: 1, since the ranks' sizes
    // differ and the route must not).
    uint64_t count = 0;
    // The group's size when the op is issued.
    int group_size = 0;
};

// The path of one collective; `why` (optional) receives the reason for a
// staged route.
CudaRoute routeFor(CudaPath path, const RouteQuery& q, std::string* why = nullptr);

// Values the host writes into the abort word (device_group.h), as evidence
// arrives; the kernels report the value back as DeviceOpResult::detail.
inline constexpr uint64_t kAbortGroupAborted = 1;  // abort() / shutdown
// (2 was "a member left the view" without naming it: abortDeactivated(rank)
// below replaced it.)
// The host's deadline for the call (the kernels' own plus a grace) passed
// with the kernels still waiting: a timeout, blaming the peer waited on.
inline constexpr uint64_t kAbortDeadline = 3;
inline constexpr uint64_t kAbortPeerDeadBase = uint64_t{1} << 32;
inline constexpr uint64_t abortPeerDead(int rank) {
    return kAbortPeerDeadBase | static_cast<uint32_t>(rank);
}
// A member the host saw leave the view while the call ran: the failure names
// it (the Work's failed_ranks_hint), as a dead one's does.
inline constexpr uint64_t kAbortDeactivatedBase = uint64_t{1} << 33;
inline constexpr uint64_t abortDeactivated(int rank) {
    return kAbortDeactivatedBase | static_cast<uint32_t>(rank);
}

// The Status of a completed call from its result word, with the ranks the
// failure points at in `failed` (the Work's failed_ranks_hint), in the CPU
// core's terms: a silent peer is kTimeout "waiting for rank N", a dead one
// kPeerFailure "rank N failed", a mismatch kInvalidArgument naming the
// peer, an abort kAborted. `what` names the collective.
Status resultStatus(const DeviceOpResult& r, const char* what, std::vector<int>* failed);

// Whether a failed call's result is news to the control plane about a peer:
// a timeout (the kernels' or the host's deadline) or a peer the host found
// dead. Not a mismatch, an abort of the group, a stale graph, or a member
// the control plane itself took out.
bool isFailureEvidence(const DeviceOpResult& r);

// The abort word's value for what the host knows while a call over ranks
// [0, size) runs, this one being `rank`: the first peer found dead, else the
// first that `still_active` (null unless a newer view was committed) says
// left the view; 0 when nothing is known against any of them.
uint64_t abortReasonFor(int rank, int size, const std::function<bool(int)>& peer_dead,
                        const std::function<bool(int)>& still_active);

}  // namespace mooncake::pg::device
