// TCP transport: reaches any peer with a listener. See tcp_transport.cc.
#pragma once

#include <memory>

#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

std::unique_ptr<Transport> createTcpTransport();

}  // namespace mooncake::te
