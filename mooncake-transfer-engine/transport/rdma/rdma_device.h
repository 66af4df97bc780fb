// One opened HCA: device discovery (verbs' list through the device filter),
// the port and GID this engine serves on, the protection domain, and memory
// registration (host memory; device memory through dma-buf).
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"
#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma {

struct DeviceDiscovery {
    std::vector<std::string> present;         // every device verbs lists
    std::vector<DeviceFilterEntry> selected;  // those the filter admits, in its order
};

// kUnavailable starting "no RDMA device" when verbs lists none or the filter
// admits none of those listed (the message lists both).
Result<DeviceDiscovery> discoverDevices(const VerbsApi& api,
                                        const std::vector<DeviceFilterEntry>& filter);

// Every access right peers and this process need on registered memory.
inline constexpr int kRegionAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

class RdmaDevice {
public:
    // Opens `entry.device`, picks its port (the given one, else the first
    // ACTIVE) and GID (MC_RDMA_GID_INDEX, else 0 on InfiniBand and the first
    // IPv4-mapped GID on RoCE) and allocates a protection domain.
    static Result<std::unique_ptr<RdmaDevice>> open(const VerbsApi& api,
                                                    const DeviceFilterEntry& entry);
    ~RdmaDevice();
    RdmaDevice(const RdmaDevice&) = delete;
    RdmaDevice& operator=(const RdmaDevice&) = delete;

    const VerbsApi& api() const { return api_; }
    const RdmaEndpoint& endpoint() const { return endpoint_; }
    ibv_context* context() const { return ctx_; }
    ibv_pd* pd() const { return pd_; }
    // READs/atomics a QP may have in flight, as initiator and as responder.
    uint8_t maxRdAtomic() const { return max_rd_atomic_; }

    Result<ibv_mr*> registerHost(void* addr, size_t length);
    // Device memory exported as a dma-buf `fd` (GPUDirect without a kernel
    // module); kUnavailable when rdma-core or the driver lacks it.
    Result<ibv_mr*> registerDmabuf(int fd, uint64_t offset, size_t length, uint64_t iova);
    void deregister(ibv_mr* mr);

private:
    RdmaDevice(const VerbsApi& api, ibv_context* ctx) : api_(api), ctx_(ctx) {}
    Status choosePort(const DeviceFilterEntry& entry);

    const VerbsApi& api_;
    ibv_context* ctx_;
    ibv_pd* pd_ = nullptr;
    RdmaEndpoint endpoint_;
    uint8_t max_rd_atomic_ = 1;
};

}  // namespace mooncake::te::rdma
