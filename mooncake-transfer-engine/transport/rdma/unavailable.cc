// Built instead of the rdma transport when WITH_RDMA=OFF (no rdma-core
// headers at build time).
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"

namespace mooncake::te {
namespace {

// A malformed filter is refused the same way with and without RDMA.
Status whyNoRdma(const RdmaOptions& options) {
    auto filter = rdma::parseDeviceFilter(options.device_filter);
    return filter.ok() ? Unavailable("no RDMA device support: built without RDMA (WITH_RDMA=OFF)")
                       : filter.status();
}

}  // namespace

RdmaSetup createRdmaTransport(const RdmaOptions& options) {
    RdmaSetup out;
    out.status = whyNoRdma(options);
    return out;
}

IbgdaProbe probeIbgda(const RdmaOptions& options) {
    IbgdaProbe out;
    out.status = whyNoRdma(options);
    return out;
}

}  // namespace mooncake::te
