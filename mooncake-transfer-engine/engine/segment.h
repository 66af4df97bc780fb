// What a process publishes about itself so peers can reach its memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

// A registered range as peers see it.
struct RegionDesc {
    uint64_t addr = 0;
    uint64_t length = 0;
    std::string location;  // "cpu" or "cuda:<ordinal>"
    bool remote_accessible = true;
    // Opaque per-transport export data, "" when not exported:
    //   shm:      the engine shared allocation holding the region: its id and
    //             bounds (transport/shm/shm_protocol.h)
    //   cuda_ipc: the cudaIpcMemHandle_t bytes
    //   rdma:     raddr, length and rkey (transport/rdma/rdma_metadata.h)
    std::string shm_export;
    std::string cuda_ipc_export;
    std::string rdma_export;

    bool contains(uint64_t a, uint64_t len) const {
        return a >= addr && len <= length && a - addr <= length - len;
    }
};

struct SegmentDesc {
    // 2: rdma_endpoint and RegionDesc.rdma_export.
    static constexpr uint32_t kVersion = 2;

    std::string name;
    // Same host_id => same kernel and network namespace (shm/cuda_ipc reachable).
    std::string host_id;
    int32_t pid = 0;
    // Increases every time the segment republishes (register/unregister).
    uint64_t generation = 0;
    std::string tcp_host;
    uint16_t tcp_port = 0;
    std::string shm_socket;  // abstract unix socket serving shm exports, "" if none
    // The HCA this segment serves RDMA on (transport/rdma/rdma_metadata.h),
    // "" without a usable RDMA device.
    std::string rdma_endpoint;
    std::vector<RegionDesc> regions;

    // The region fully containing [addr, addr + len), or nullptr.
    const RegionDesc* findRegion(uint64_t addr, uint64_t len) const;

    std::string serialize() const;
    static Result<SegmentDesc> parse(std::string_view bytes);
};

// This machine's identity for same-host checks: boot id + network namespace.
const std::string& localHostId();

}  // namespace mooncake::te
