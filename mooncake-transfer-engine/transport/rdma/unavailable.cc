// Built instead of the rdma transport when WITH_RDMA=OFF (no rdma-core
// headers at build time).
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"

namespace mooncake::te {

RdmaSetup createRdmaTransport(const RdmaOptions& options) {
    (void)options;
    RdmaSetup out;
    out.status = Unavailable("no RDMA device support: built without RDMA (WITH_RDMA=OFF)");
    return out;
}

}  // namespace mooncake::te
