// The NCCL device-API (GIN) transport of ElasticBuffer, torch-free. One
// NcclEpTransport per ElasticBuffer generation owns:
//   * an NCCL communicator over the EP group (the unique id comes from group
//     rank 0 through the caller's broadcast: no application bootstrap);
//   * one symmetric window (ncclMemAlloc + ncclCommWindowRegister) holding
//     the EP buffer in the layout of core/buffer_layout.h, followed by the
//     send staging area GIN puts read from;
//   * a device communicator with GIN contexts and one GIN signal per
//     signal word of the layout;
//   * the device table of LSA peers' window pointers (null for peers outside
//     this rank's LSA team, which GIN reaches).
// dispatch/combine produce exactly the outputs of the cuda_ipc kernels
// (ep_kernels.h): LSA peers are written with loads/stores, the others with
// GIN puts whose completion a GIN signal publishes (hybrid mode).
//
// Built only with USE_NCCL_DEVICE (MOONCAKE_EP_NCCL_DEVICE defined); the
// NCCL headers stay in the .cc/.cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>

#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

inline constexpr int kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

struct NcclEpOptions {
    int rank = 0;
    int num_ranks = 0;
    int device = 0;
    // The fixed EP shape of this generation (the window is sized for it).
    int num_experts = 0;
    int max_tokens = 0;
    int hidden = 0;
    int64_t timeout_ms = 30000;  // communicator setup deadline
    std::array<char, kNcclUniqueIdBytes> unique_id{};
};

// NCCL_VERSION_CODE of the headers this file was compiled with.
int ncclEpBuiltVersion();
// The version of the libnccl loaded now (0 if ncclGetVersion fails).
int ncclEpRuntimeVersion();
// A fresh unique id (group rank 0 makes it, the caller broadcasts it).
Status ncclEpUniqueId(std::array<char, kNcclUniqueIdBytes>* out);

// Window bytes for these limits: the EP layout plus the send staging.
int64_t ncclEpWindowBytes(int num_ranks, int num_experts, int max_tokens, int hidden);

class NcclEpTransport {
public:
    // Collective over the num_ranks processes holding the same unique id.
    // Every wait is bounded by options.timeout_ms (then the communicator is
    // aborted and the error names the step).
    static Status create(const NcclEpOptions& options, std::unique_ptr<NcclEpTransport>* out);
    ~NcclEpTransport();  // releases what destroy() has not (local teardown)
    NcclEpTransport(const NcclEpTransport&) = delete;
    NcclEpTransport& operator=(const NcclEpTransport&) = delete;

    // Collective, deterministic release: device communicator, window,
    // memory, communicator (finalized, then destroyed). Idempotent.
    Status destroy();

    const NcclEpOptions& options() const { return options_; }
    // The group arguments for an op (active_ranks: device int32 [num_ranks]).
    EpGroupArgs groupArgs(int32_t* active_ranks, int64_t timeout_ns) const;
    int lsaSize() const;

    Status launchDispatch(const EpGroupArgs& g, const DispatchArgs& a, cudaStream_t stream);
    Status launchCombine(const EpGroupArgs& g, const CombineArgs& a, cudaStream_t stream);

private:
    struct Impl;
    explicit NcclEpTransport(const NcclEpOptions& options);
    NcclEpOptions options_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake::ep
