// What the NCCL transport's kernels get besides the EP arguments: the device
// communicator, the symmetric window, and the send-side bookkeeping. Shared
// by the host setup (nccl_transport.cc) and the kernels (nccl_kernels.cu).
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstdint>

#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

struct NcclEpDevice {
    ncclDevComm comm;
    ncclWindow_t window = nullptr;  // the EP layout at offset 0, staging after it
    int64_t staging_offset = 0;     // window offset of the send staging
    // Device u64 [2 * num_experts]: the last sequence number this rank
    // signalled per GIN signal it writes (dispatch: per global expert,
    // combine: per (local expert, destination)), so a SignalAdd can raise the
    // receiver's signal to exactly that sequence number.
    uint64_t* last_sent = nullptr;
};

// GIN signal ids mirror the layout's signal words: dispatch count
// (local_expert, src) is local_expert * num_ranks + src, combine flag of
// global expert e is nle * num_ranks + e.
inline int ncclEpSignalCount(int num_ranks, int num_experts) {
    return (num_experts / num_ranks) * num_ranks + num_experts;
}

// Fills peers[num_ranks] (device) with the LSA peers' window bases, null for
// ranks outside this rank's LSA team.
Status launchNcclPeerTable(const NcclEpDevice& d, int num_ranks, void** peers, cudaStream_t stream);
Status launchNcclDispatch(const NcclEpDevice& d, const EpGroupArgs& g, const DispatchArgs& a,
                          cudaStream_t stream);
Status launchNcclCombine(const NcclEpDevice& d, const EpGroupArgs& g, const CombineArgs& a,
                         cudaStream_t stream);

}  // namespace mooncake::ep
