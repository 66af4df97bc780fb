// Host entry to the device-side WQE encoding check (mlx5_wqe_device.cu).
#pragma once

#include <cstdint>
#include <string>

#include "mooncake-transfer-engine/transport/rdma/mlx5_wqe.h"

namespace mooncake::te::rdma::mlx5 {

// Runs the encoder in a kernel: `write` into sq_out[0..64), `count` into
// sq_out[64..128), then the doorbell record for count.wqe_index + 1.
// "" on success; the reason starting "no usable CUDA device" where there is
// no GPU; otherwise "ERROR ..." (a failure, not a skip).
std::string encodeOnDevice(const WriteWqe& write, const FetchAddWqe& count,
                           unsigned char sq_out[128], uint32_t dbrec_out[2]);

}  // namespace mooncake::te::rdma::mlx5
