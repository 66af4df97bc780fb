#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mooncake-transfer-engine/common/env.h"

namespace mooncake::te::rdma {

namespace {

// -1: choose (see RdmaDevice::open).
MC_ENV_INT(RdmaGidIndex, "MC_RDMA_GID_INDEX", -1)

std::string joined(const std::vector<std::string>& names) {
    std::string out = "[";
    for (size_t i = 0; i < names.size(); ++i)
        out += (i ? ", " : "") + names[i];
    return out + "]";
}

bool ipv4Mapped(const ibv_gid& gid) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return std::memcmp(gid.raw, prefix, sizeof(prefix)) == 0;
}

}  // namespace

Result<DeviceDiscovery> discoverDevices(const VerbsApi& api,
                                        const std::vector<DeviceFilterEntry>& filter) {
    int count = 0;
    errno = 0;
    ibv_device** list = api.getDeviceList(&count);
    if (!list) {
        // ENOSYS: the kernel has no uverbs; rdma-core reports it this way.
        const int err = errno ? errno : ENOSYS;
        Status st = verbsError("ibv_get_device_list", err);
        return Unavailable("no RDMA device (" + st.message() +
                           (err == ENOSYS ? ": the kernel has no RDMA support loaded)" : ")"));
    }
    DeviceDiscovery out;
    for (int i = 0; i < count; ++i) {
        const char* name = api.getDeviceName(list[i]);
        if (name)
            out.present.emplace_back(name);
    }
    api.freeDeviceList(list);
    if (out.present.empty())
        return Unavailable("no RDMA device (ibv_get_device_list lists none)");
    FilteredDevices f = applyDeviceFilter(out.present, filter);
    if (f.selected.empty())
        return Unavailable("no RDMA device admitted by the device filter " + joined(f.unmatched) +
                           "; present: " + joined(out.present));
    out.selected = std::move(f.selected);
    return out;
}

Result<std::unique_ptr<RdmaDevice>> RdmaDevice::open(const VerbsApi& api,
                                                     const DeviceFilterEntry& entry) {
    int count = 0;
    errno = 0;
    ibv_device** list = api.getDeviceList(&count);
    if (!list)
        return verbsError("ibv_get_device_list", errno ? errno : ENOSYS);
    ibv_context* ctx = nullptr;
    int err = ENODEV;
    for (int i = 0; i < count && !ctx; ++i) {
        const char* name = api.getDeviceName(list[i]);
        if (name && entry.device == name) {
            errno = 0;
            ctx = api.openDevice(list[i]);
            err = errno ? errno : ENODEV;
        }
    }
    api.freeDeviceList(list);
    if (!ctx)
        return verbsError("ibv_open_device", err, "device " + entry.device);
    std::unique_ptr<RdmaDevice> dev(new RdmaDevice(api, ctx));
    dev->endpoint_.device = entry.device;
    MC_RETURN_IF_ERROR(dev->choosePort(entry));
    errno = 0;
    dev->pd_ = api.allocPd(ctx);
    if (!dev->pd_)
        return verbsError("ibv_alloc_pd", errno ? errno : ENOMEM, "device " + entry.device);
    return dev;
}

Status RdmaDevice::choosePort(const DeviceFilterEntry& entry) {
    ibv_device_attr dattr;
    std::memset(&dattr, 0, sizeof(dattr));
    int rc = api_.queryDevice(ctx_, &dattr);
    if (rc != 0)
        return verbsError("ibv_query_device", rc, "device " + entry.device);
    max_rd_atomic_ = static_cast<uint8_t>(
        std::max(1, std::min({16, dattr.max_qp_rd_atom, dattr.max_qp_init_rd_atom})));
    const int first = entry.port ? entry.port : 1;
    const int last = entry.port ? entry.port : dattr.phys_port_cnt;
    for (int port = first; port <= last; ++port) {
        const std::string what = "device " + entry.device + " port " + std::to_string(port);
        ibv_port_attr pattr;
        rc = api_.portAttributes(ctx_, static_cast<uint8_t>(port), &pattr);
        if (rc != 0)
            return verbsError("ibv_query_port", rc, what);
        if (pattr.state != IBV_PORT_ACTIVE)
            continue;
        int gid_index = static_cast<int>(envRdmaGidIndex());
        ibv_gid gid;
        std::memset(&gid, 0, sizeof(gid));
        if (gid_index < 0) {
            gid_index = 0;
            // RoCE v2 routes by IP: an IPv4-mapped GID is the routable one.
            for (int i = 0; pattr.link_layer == IBV_LINK_LAYER_ETHERNET && i < pattr.gid_tbl_len;
                 ++i) {
                ibv_gid candidate;
                if (api_.queryGid(ctx_, static_cast<uint8_t>(port), i, &candidate) == 0 &&
                    ipv4Mapped(candidate)) {
                    gid_index = i;
                    break;
                }
            }
        }
        rc = api_.queryGid(ctx_, static_cast<uint8_t>(port), gid_index, &gid);
        if (rc != 0)
            return verbsError("ibv_query_gid", rc > 0 ? rc : (errno ? errno : EIO),
                              what + " GID index " + std::to_string(gid_index));
        endpoint_.port = static_cast<uint8_t>(port);
        endpoint_.gid_index = static_cast<uint8_t>(gid_index);
        endpoint_.lid = pattr.lid;
        std::memcpy(endpoint_.gid, gid.raw, 16);
        endpoint_.mtu = static_cast<uint8_t>(pattr.active_mtu);
        endpoint_.link_layer = pattr.link_layer;
        return Status::OK();
    }
    return Unavailable("device " + entry.device +
                       (entry.port ? " port " + std::to_string(entry.port) + " is not ACTIVE"
                                   : " has no ACTIVE port"));
}

RdmaDevice::~RdmaDevice() {
    if (pd_)
        (void)api_.deallocPd(pd_);
    if (ctx_)
        (void)api_.closeDevice(ctx_);
}

Result<ibv_mr*> RdmaDevice::registerHost(void* addr, size_t length) {
    errno = 0;
    ibv_mr* mr = api_.regMr(pd_, addr, length, kRegionAccess);
    if (!mr)
        return verbsError("ibv_reg_mr", errno ? errno : ENOMEM,
                          std::to_string(length) + " bytes of host memory on " + endpoint_.device);
    return mr;
}

Result<ibv_mr*> RdmaDevice::registerDmabuf(int fd, uint64_t offset, size_t length, uint64_t iova) {
    if (!api_.regDmabufMr)
        return Unavailable("ibv_reg_dmabuf_mr is missing from this rdma-core");
    errno = 0;
    ibv_mr* mr = api_.regDmabufMr(pd_, offset, length, iova, fd, kRegionAccess);
    if (!mr)
        return verbsError(
            "ibv_reg_dmabuf_mr", errno ? errno : ENOMEM,
            std::to_string(length) + " bytes of device memory on " + endpoint_.device);
    return mr;
}

void RdmaDevice::deregister(ibv_mr* mr) {
    if (mr)
        (void)api_.deregMr(mr);
}

}  // namespace mooncake::te::rdma
