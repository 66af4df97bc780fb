// Builds the WQE encoder as device code, the way an IBGDA kernel will call it.
#include "mooncake-transfer-engine/transport/rdma/mlx5_wqe.h"

namespace mooncake::te::rdma::mlx5 {

__global__ void encodeWriteThenCount(uint64_t* sq, uint32_t* dbrec, WriteWqe write,
                                     FetchAddWqe count) {
    encodeRdma(sq, write);
    encodeFetchAdd(sq + 8, count);
    __threadfence_system();
    updateSendDoorbellRecord(dbrec, count.wqe_index + 1u);
}

}  // namespace mooncake::te::rdma::mlx5
