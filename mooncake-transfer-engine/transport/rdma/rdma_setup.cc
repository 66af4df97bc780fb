// createRdmaTransport: loads verbs, discovers devices through the filter and
// opens the first usable one; otherwise says why there is no rdma.
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

namespace mooncake::te {

RdmaSetup createRdmaTransport(const RdmaOptions& options) {
    using namespace rdma;
    RdmaSetup out;
    auto filter = parseDeviceFilter(options.device_filter);
    if (!filter.ok()) {
        out.status = filter.status();
        return out;
    }
    auto api = options.verbs_library.empty() ? VerbsApi::get() : [&]() -> Result<const VerbsApi*> {
        // A test's library: loaded each time, kept for the process.
        auto loaded = VerbsApi::load(options.verbs_library.c_str());
        if (!loaded.ok())
            return loaded.status();
        return new VerbsApi(loaded.value());
    }();
    if (!api.ok()) {
        out.status = api.status();
        return out;
    }
    auto found = discoverDevices(*api.value(), filter.value());
    if (!found.ok()) {
        out.status = found.status();
        return out;
    }
    for (const DeviceFilterEntry& e : found->selected)
        out.devices.push_back(e.device);
    // The first device that opens with an ACTIVE port serves this engine.
    std::string reasons;
    for (const DeviceFilterEntry& e : found->selected) {
        auto dev = RdmaDevice::open(*api.value(), e);
        if (dev.ok()) {
            out.transport = makeRdmaTransport(std::move(dev).value());
            out.status = Status::OK();
            return out;
        }
        reasons += (reasons.empty() ? "" : "; ") + dev.status().toString();
    }
    out.status = Unavailable("no usable RDMA device: " + reasons);
    return out;
}

}  // namespace mooncake::te
