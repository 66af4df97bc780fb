// Host-side settings of the GPU-initiated (IBGDA) EP transport.
#pragma once

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

// RC QPs per peer rank that EP kernels post to (MOONCAKE_EP_ACTIVE_QPS_PER_RANK).
// More QPs spread WQEs over more send queues (and NIC processing units);
// each costs a send queue, a CQ and a doorbell record in GPU memory.
inline constexpr int kDefaultActiveQpsPerRank = 8;
inline constexpr int kMaxActiveQpsPerRank = 256;

// `value` is the variable's text or nullptr when unset. Unset or "" gives the
// default; anything but a decimal integer in 1..kMaxActiveQpsPerRank is
// kInvalidArgument naming the variable, the value and the range.
Result<int> parseActiveQpsPerRank(const char* value);
// Reads the environment.
Result<int> activeQpsPerRankFromEnv();

}  // namespace mooncake::te::rdma
