// Built instead of the rdma transport when WITH_RDMA=OFF (no rdma-core
// headers at build time).
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"

namespace mooncake::te {

RdmaSetup createRdmaTransport(const RdmaOptions& options) {
    RdmaSetup out;
    // A malformed filter is refused the same way with and without RDMA.
    auto filter = rdma::parseDeviceFilter(options.device_filter);
    out.status = filter.ok()
                     ? Unavailable("no RDMA device support: built without RDMA (WITH_RDMA=OFF)")
                     : filter.status();
    return out;
}

}  // namespace mooncake::te
