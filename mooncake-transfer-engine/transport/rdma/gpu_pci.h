// The PCI bus id of a CUDA device, for get_preferred_hca. Loads the CUDA
// driver at run time (no CUDA headers), so it builds everywhere.
#pragma once

#include <string>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

// "0000:3b:00.0" for CUDA device `ordinal` (as CUDA numbers them, after
// CUDA_VISIBLE_DEVICES); kUnavailable without a driver or that device.
Result<std::string> cudaPciBusId(int ordinal);

}  // namespace mooncake::te::rdma
