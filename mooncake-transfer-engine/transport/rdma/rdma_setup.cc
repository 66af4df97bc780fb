// createRdmaTransport: loads verbs, discovers devices through the filter and
// opens the first usable one; otherwise says why there is no rdma. probeIbgda
// asks the same of IBGDA, which also needs an mlx5 device.
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

namespace mooncake::te {

namespace {

struct Discovered {
    const rdma::VerbsApi* api = nullptr;
    rdma::DeviceDiscovery devices;
};

// Parses the filter, loads verbs and lists the admitted devices.
Result<Discovered> discover(const RdmaOptions& options) {
    using namespace rdma;
    auto filter = parseDeviceFilter(options.device_filter);
    if (!filter.ok())
        return filter.status();
    auto api = VerbsApi::getOrLoad(options.verbs_library);
    if (!api.ok())
        return api.status();
    auto found = discoverDevices(*api.value(), filter.value());
    if (!found.ok())
        return found.status();
    return Discovered{api.value(), std::move(found).value()};
}

}  // namespace

RdmaSetup createRdmaTransport(const RdmaOptions& options) {
    using namespace rdma;
    RdmaSetup out;
    auto found = discover(options);
    if (!found.ok()) {
        out.status = found.status();
        return out;
    }
    const VerbsApi* api = found->api;
    for (const DeviceFilterEntry& e : found->devices.selected)
        out.devices.push_back(e.device);
    // The first device that opens with an ACTIVE port serves this engine.
    std::string reasons;
    for (const DeviceFilterEntry& e : found->devices.selected) {
        auto dev = RdmaDevice::open(*api, e);
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

Result<std::unique_ptr<rdma::RdmaDevice>> rdma::openIbgdaDevice(const RdmaOptions& options) {
    MC_ASSIGN_OR_RETURN(Discovered found, discover(options));
    const VerbsApi* api = found.api;
    auto dv = Mlx5DirectApi::load(options.mlx5_library);
    if (!dv.ok())
        return Unavailable("no IBGDA-capable device: " + dv.status().message());
    int count = 0;
    ibv_device** list = api->getDeviceList(&count);
    std::unique_ptr<RdmaDevice> device;
    std::string reasons;
    for (const DeviceFilterEntry& e : found.devices.selected) {
        ibv_device* dev = nullptr;
        for (int i = 0; list && i < count && !dev; ++i) {
            if (e.device == api->getDeviceName(list[i]))
                dev = list[i];
        }
        std::string why;
        if (!dev) {
            why = e.device + " vanished from the device list";
        } else if (!dv->isSupported(dev)) {
            why = e.device + " is not an mlx5 (ConnectX) device";
        } else {
            auto opened = RdmaDevice::open(*api, e);  // the ACTIVE-port check
            if (opened.ok()) {
                device = std::move(opened).value();
                break;
            }
            why = opened.status().toString();
        }
        reasons += (reasons.empty() ? "" : "; ") + why;
    }
    if (list)
        api->freeDeviceList(list);
    if (!device)
        return Unavailable("no IBGDA-capable device: " + reasons);
    return device;
}

IbgdaProbe probeIbgda(const RdmaOptions& options) {
    IbgdaProbe out;
    auto device = rdma::openIbgdaDevice(options);
    if (device.ok())
        out.device = device.value()->endpoint().device;
    else
        out.status = device.status();
    return out;
}

}  // namespace mooncake::te
