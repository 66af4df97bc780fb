// RDMA transport (ibverbs RC): reaches peers on other hosts that publish an
// RDMA endpoint, over one HCA chosen from the device filter. Without the
// verbs library, without a device, or when the filter admits none, there is
// no transport and the reason is reported once; other-host peers then use
// tcp. See docs/rdma.md for what has run on hardware (nothing yet).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

struct RdmaOptions {
    std::vector<std::string> device_filter;  // as given to TransferEngine::init
    // The verbs library to load ("" = libibverbs.so.1); tests name one that
    // does not exist.
    std::string verbs_library;
    // The mlx5 direct-verbs library probeIbgda asks ("" = libmlx5.so.1).
    std::string mlx5_library;
};

struct RdmaSetup {
    std::unique_ptr<Transport> transport;  // nullptr when RDMA is not usable
    std::vector<std::string> devices;      // HCAs the filter admits (get_preferred_hca)
    // OK with a transport; otherwise why there is none: kUnavailable ("no RDMA
    // device", "the verbs library is missing", "built without RDMA"), or
    // kInvalidArgument for a malformed device filter (init fails then).
    Status status;
};

RdmaSetup createRdmaTransport(const RdmaOptions& options);

// Whether this host could run EP's GPU-initiated RDMA (IBGDA): a device the
// filter admits, with an ACTIVE port, that the mlx5 direct-verbs library
// supports (ConnectX). OK with `device` naming the first; otherwise
// kUnavailable saying why: "no RDMA device ..." (verbs missing, no device,
// none admitted) or "no IBGDA-capable device: ..." (devices exist but none
// is usable for IBGDA), or kInvalidArgument for a malformed filter.
struct IbgdaProbe {
    Status status;
    std::string device;
};
IbgdaProbe probeIbgda(const RdmaOptions& options);

namespace rdma {
class RdmaDevice;
// The transport over an opened device (rdma_setup.cc picks the device).
std::unique_ptr<Transport> makeRdmaTransport(std::unique_ptr<RdmaDevice> device);
// The device probeIbgda names, opened once (its ACTIVE-port check is the
// open), for EP's IBGDA endpoint; probeIbgda's errors otherwise.
Result<std::unique_ptr<RdmaDevice>> openIbgdaDevice(const RdmaOptions& options);
}  // namespace rdma

}  // namespace mooncake::te
