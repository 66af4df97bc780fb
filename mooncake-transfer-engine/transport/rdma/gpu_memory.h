// What the rdma transport needs from CUDA for device memory, without CUDA
// headers (so it builds with USE_CUDA=OFF) and without loading CUDA itself:
// libcuda is looked up only if the process already loaded it, since device
// memory can only exist then.
//
//   - a dma-buf fd for a device range, for ibv_reg_dmabuf_mr (GPUDirect RDMA
//     without nvidia-peermem; needs an open kernel driver >= 515, CUDA >= 11.7);
//   - synchronous copies between device and host memory, for host staging
//     when the range cannot be registered.
// Neither has run against a NIC here: see docs/rdma.md.
#pragma once

#include <cstdint>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

struct DmabufRange {
    int fd = -1;          // owned by the caller (close after registering)
    uint64_t offset = 0;  // of `addr` within the dma-buf
};

// A dma-buf for [addr, addr + length) of device memory; the exported range is
// widened to host pages as the driver requires. kUnavailable with the reason
// when CUDA is not loaded or the driver cannot export dma-bufs.
Result<DmabufRange> exportDmabuf(uint64_t addr, uint64_t length);

// cuMemcpy between unified addresses, in the context that owns the device side.
Status copyDeviceHost(void* dst, const void* src, uint64_t length, const void* device_ptr);

}  // namespace mooncake::te::rdma
