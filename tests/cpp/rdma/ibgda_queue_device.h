// Host entry to the device-side IBGDA queue check (ibgda_queue_device.cu).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"

namespace mooncake::te::rdma {

// A kernel posts `n` puts with counts through a send queue of `wqe_count`
// BBs that the software HCA executes. "" on success; the reason starting
// "no usable CUDA device" where there is no GPU; otherwise "ERROR ...".
std::string postPutsFromKernel(int n, uint32_t wqe_count);

// The same kernel on queues already mapped for the device (device addresses
// in `sq`/`cq`; `puts` readable by the device), calling `pump` on this thread
// until it ends (a software HCA's turn). Same return convention.
std::string postPutsOnDevice(const mlx5::SendQueue& sq, const mlx5::CompletionQueue& cq,
                             const mlx5::PutWithCount* puts, int n,
                             const std::function<void()>& pump);

}  // namespace mooncake::te::rdma
