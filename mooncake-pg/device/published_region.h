// Device memory one process publishes for the other processes of its group
// to map through the group's transfer engine (cuda_ipc): its address and
// layout as "<address> <unit bytes> <bytes>" in the group's store, under a
// key the owner names after its engine segment. Used by the group window
// (group_window.h: unit = slot bytes) and the P2P pools (p2p_pools.h: unit
// = pool bytes per sender). Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg::device {

struct PublishedRegion {
    uint64_t addr = 0;
    uint64_t unit = 0;   // the layout's unit, which every rank must share
    uint64_t bytes = 0;  // the whole region
};

Status publishRegion(KVStore& store, const std::string& key, const PublishedRegion& region);

// The region published under `key`, waiting for it until `deadline`. A
// value that does not parse is Internal("<what> published as '<value>'").
Result<PublishedRegion> readRegion(KVStore& store, const std::string& key, const std::string& what,
                                   Deadline deadline);

// Maps `bytes` at `addr` of the process behind engine segment `segment`.
Result<char*> mapRegion(te::TransferEngine& engine, const std::string& segment, uint64_t addr,
                        uint64_t bytes, Deadline deadline);

}  // namespace mooncake::pg::device
