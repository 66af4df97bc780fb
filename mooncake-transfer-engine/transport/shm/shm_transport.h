// Shared-memory transport: same-host peers map each other's engine shared
// allocations, so a transfer is a memcpy. See shm_transport.cc.
#pragma once

#include <memory>

#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

std::unique_ptr<Transport> createShmTransport();

}  // namespace mooncake::te
