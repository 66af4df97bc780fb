// Which HCAs the rdma transport may use: pg.set_device_filter([...]),
// TransferEngine(device_filter=...), or a comma list in an environment knob
// (MOONCAKE_EP_DEVICE_FILTER, MOONCAKE_PGTEST_DEVICE_FILTERS). An entry is a
// device name ("mlx5_1") or a device and port ("mlx5_1:1").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

struct DeviceFilterEntry {
    std::string device;
    int port = 0;  // 0: the device's first active port
    bool operator==(const DeviceFilterEntry&) const = default;
};

// kInvalidArgument naming the entry and what was expected for an empty or
// malformed entry, a port outside 1..255, or a device listed twice. An empty
// list means "no filter".
Result<std::vector<DeviceFilterEntry>> parseDeviceFilter(const std::vector<std::string>& entries);
// The same for "mlx5_0,mlx5_1:2" (spaces around entries are ignored).
Result<std::vector<DeviceFilterEntry>> parseDeviceFilter(std::string_view comma_list);

struct FilteredDevices {
    std::vector<DeviceFilterEntry> selected;  // in filter order (all devices when no filter)
    std::vector<std::string> unmatched;       // filter entries naming absent devices
};

// Applies `filter` to the devices present. Never fails: a filter that names
// nothing present leaves `selected` empty and the caller reports it.
FilteredDevices applyDeviceFilter(const std::vector<std::string>& present,
                                  const std::vector<DeviceFilterEntry>& filter);

}  // namespace mooncake::te::rdma
