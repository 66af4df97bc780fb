// Device all_to_all with split sizes (all_to_all_single with input and
// output split sizes), direct only: every member's input is mapped in every
// member's process and each rank pulls its blocks straight into its output,
// per the plan of all_to_all_v_plan.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mooncake-pg/device/all_to_all_v_plan.h"
#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

// Queues the call on `stream`: once every member has signalled its input
// ready, this rank copies block `rank` of every member's input (per the
// plan) into its output, then waits until every member has copied before
// the call completes (three steps, no window copies). Every member's input
// is mapped here (`buffers.inputs`); this rank's output must not overlap
// its input (the members read it while this rank writes).
Status directAllToAllV(const DeviceGroupView& group, const MemberBuffers& buffers,
                       const AllToAllVPlan& plan, uint64_t input_bytes, uint64_t output_bytes,
                       uint64_t seq, DeviceOpResult* result, cudaStream_t stream);

}  // namespace mooncake::pg::device
