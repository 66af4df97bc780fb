// Host entry to the device-side IBGDA queue check (ibgda_queue_device.cu).
#pragma once

#include <cstdint>
#include <string>

namespace mooncake::te::rdma {

// A kernel posts `n` puts with counts through a send queue of `wqe_count`
// BBs that the software HCA executes. "" on success; the reason starting
// "no usable CUDA device" where there is no GPU; otherwise "ERROR ...".
std::string postPutsFromKernel(int n, uint32_t wqe_count);

}  // namespace mooncake::te::rdma
