#include "mooncake-transfer-engine/transport/rdma/device_filter.h"

#include <algorithm>
#include <cctype>

namespace mooncake::te::rdma {

namespace {

// IBV_SYSFS_NAME_MAX is 64 including the terminator.
constexpr size_t kMaxNameLength = 63;

bool validNameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

Result<DeviceFilterEntry> parseEntry(std::string_view raw) {
    const std::string shown = "device_filter entry '" + std::string(raw) + "'";
    const size_t colon = raw.find(':');
    std::string_view name = raw.substr(0, colon);
    if (name.empty())
        return InvalidArgument(shown +
                               " has no device name; expected a name like 'mlx5_0' "
                               "or 'mlx5_0:1'");
    if (name.size() > kMaxNameLength || !std::all_of(name.begin(), name.end(), validNameChar))
        return InvalidArgument(shown +
                               " is not a device name; expected letters, digits, '_', "
                               "'-' or '.', at most 63 characters (like 'mlx5_0')");
    DeviceFilterEntry entry{std::string(name), 0};
    if (colon == std::string_view::npos)
        return entry;
    std::string_view port = raw.substr(colon + 1);
    int value = 0;
    bool digits = !port.empty() && port.size() <= 3;
    for (char c : port) {
        if (!std::isdigit(static_cast<unsigned char>(c))) {
            digits = false;
            break;
        }
        value = value * 10 + (c - '0');
    }
    if (!digits || value < 1 || value > 255)
        return InvalidArgument(shown + " has port '" + std::string(port) +
                               "'; expected a port number in 1..255 after ':'");
    entry.port = value;
    return entry;
}

}  // namespace

Result<std::vector<DeviceFilterEntry>> parseDeviceFilter(const std::vector<std::string>& entries) {
    std::vector<DeviceFilterEntry> out;
    for (const std::string& raw : entries) {
        MC_ASSIGN_OR_RETURN(DeviceFilterEntry entry, parseEntry(raw));
        for (const DeviceFilterEntry& seen : out) {
            if (seen.device == entry.device)
                return InvalidArgument("device_filter lists device '" + entry.device +
                                       "' twice; expected each device at most once");
        }
        out.push_back(std::move(entry));
    }
    return out;
}

Result<std::vector<DeviceFilterEntry>> parseDeviceFilter(std::string_view comma_list) {
    std::vector<std::string> entries;
    size_t start = 0;
    while (start <= comma_list.size()) {
        size_t end = comma_list.find(',', start);
        if (end == std::string_view::npos)
            end = comma_list.size();
        std::string_view item = comma_list.substr(start, end - start);
        while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front())))
            item.remove_prefix(1);
        while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back())))
            item.remove_suffix(1);
        // "a,,b" or a trailing comma is a typo worth reporting; "" is no filter.
        if (item.empty() && !comma_list.empty())
            return InvalidArgument("device_filter '" + std::string(comma_list) +
                                   "' has an empty entry; expected names separated by ','");
        if (!item.empty())
            entries.emplace_back(item);
        start = end + 1;
    }
    return parseDeviceFilter(entries);
}

FilteredDevices applyDeviceFilter(const std::vector<std::string>& present,
                                  const std::vector<DeviceFilterEntry>& filter) {
    FilteredDevices out;
    if (filter.empty()) {
        for (const std::string& name : present)
            out.selected.push_back(DeviceFilterEntry{name, 0});
        return out;
    }
    for (const DeviceFilterEntry& entry : filter) {
        if (std::find(present.begin(), present.end(), entry.device) != present.end())
            out.selected.push_back(entry);
        else
            out.unmatched.push_back(entry.device);
    }
    return out;
}

}  // namespace mooncake::te::rdma
