// Everything a fast-path Buffer needs to reach its peers over IBGDA, in the
// order it is built:
//   1. create()    the IbgdaEndpoint (probe, EP buffer registered, QPs
//                  made), then the send staging, zeroed (the shadows start
//                  at 0) and registered;
//   2. the group exchanges the endpoint's words and calls its connect()
//      (python/mooncake/_ep_ibgda.py);
//   3. activate()  maps every QP into the GPU (IbgdaDeviceQueues) and
//                  uploads the kernels' tables: one channel per QP, every
//                  peer's buffer address and key.
// device() is then what launchIbgdaDispatch/launchIbgdaCombine take. The
// link is released after the kernels using it have finished (the Buffer
// synchronizes first); it unmaps the queues before the endpoint destroys
// them. Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <memory>
#include <vector>

#include "mooncake-ep/ibgda/device_queues.h"
#include "mooncake-ep/ibgda/endpoint.h"
#include "mooncake-ep/ibgda/ibgda_kernels.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::ep {

class IbgdaLink {
public:
    // `endpoint.buffer`/`bytes` are the EP buffer; the staging is the link's
    // own, ibgdaStagingBytesFor(bytes) of device memory (buffer_on_device)
    // or of pinned host memory (the software-HCA tests).
    static Result<std::unique_ptr<IbgdaLink>> create(const IbgdaEndpointOptions& endpoint);
    ~IbgdaLink();
    IbgdaLink(const IbgdaLink&) = delete;
    IbgdaLink& operator=(const IbgdaLink&) = delete;

    IbgdaEndpoint& endpoint() { return *endpoint_; }
    // After endpoint().connect(). kFailedPrecondition before it or twice.
    Status activate();
    bool active() const { return tables_ != nullptr; }
    // The kernels' view (device addresses); valid once active().
    const IbgdaEpDevice& device() const { return device_; }

private:
    IbgdaLink() = default;

    bool staging_on_device_ = true;
    void* staging_ = nullptr;
    std::unique_ptr<IbgdaEndpoint> endpoint_;
    std::vector<std::unique_ptr<IbgdaDeviceQueues>> queues_;
    void* tables_ = nullptr;  // one device allocation: channels, bases, keys
    IbgdaEpDevice device_;
};

}  // namespace mooncake::ep
