// The group's call counter on the device (device_group.h, seq_on_device):
// what the host does to it besides the kernels' own advance.
#pragma once

#include <cuda_runtime_api.h>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::device {

// Queues, on `stream`, the advance of this rank's call counter by one call:
// for a call this rank numbered (GroupWindow::nextCall) but did not queue,
// since the members that queued it advanced theirs. Nothing without
// seq_on_device.
Status skipCall(const DeviceGroupView& group, cudaStream_t stream);

}  // namespace mooncake::pg::device
