#include "mooncake-transfer-engine/engine/segment.h"

#include <unistd.h>

#include <fstream>

#include "mooncake-transfer-engine/common/serialize.h"

namespace mooncake::te {

namespace {
constexpr uint32_t kMaxRegions = 1 << 16;
constexpr uint32_t kSegmentMagic = 0x4d435347;  // "MCSG"
}  // namespace

const RegionDesc* SegmentDesc::findRegion(uint64_t addr, uint64_t len) const {
    for (const auto& r : regions) {
        if (r.contains(addr, len))
            return &r;
    }
    return nullptr;
}

std::string SegmentDesc::serialize() const {
    ByteWriter w;
    w.put(kSegmentMagic);
    w.put(kVersion);
    w.putString(name);
    w.putString(host_id);
    w.put(pid);
    w.put(generation);
    w.putString(tcp_host);
    w.put(tcp_port);
    w.putString(shm_socket);
    w.putString(rdma_endpoint);
    w.put(static_cast<uint32_t>(regions.size()));
    for (const auto& r : regions) {
        w.put(r.addr);
        w.put(r.length);
        w.putString(r.location);
        w.put(static_cast<uint8_t>(r.remote_accessible));
        w.putString(r.shm_export);
        w.putString(r.cuda_ipc_export);
        w.putString(r.rdma_export);
    }
    return w.take();
}

Result<SegmentDesc> SegmentDesc::parse(std::string_view bytes) {
    ByteReader r(bytes);
    SegmentDesc d;
    uint32_t magic = 0, version = 0, nregions = 0;
    r.get(&magic);
    r.get(&version);
    if (!r.ok() || magic != kSegmentMagic)
        return InvalidArgument("not a segment descriptor");
    if (version != kVersion) {
        return InvalidArgument("segment descriptor version " + std::to_string(version) +
                               ", expected " + std::to_string(kVersion));
    }
    r.getString(&d.name);
    r.getString(&d.host_id);
    r.get(&d.pid);
    r.get(&d.generation);
    r.getString(&d.tcp_host);
    r.get(&d.tcp_port);
    r.getString(&d.shm_socket);
    r.getString(&d.rdma_endpoint);
    r.get(&nregions);
    if (!r.ok() || nregions > kMaxRegions)
        return InvalidArgument("truncated segment descriptor");
    for (uint32_t i = 0; i < nregions && r.ok(); ++i) {
        RegionDesc reg;
        uint8_t accessible = 0;
        r.get(&reg.addr);
        r.get(&reg.length);
        r.getString(&reg.location);
        r.get(&accessible);
        r.getString(&reg.shm_export);
        r.getString(&reg.cuda_ipc_export);
        r.getString(&reg.rdma_export);
        reg.remote_accessible = accessible != 0;
        d.regions.push_back(std::move(reg));
    }
    if (!r.ok() || !r.atEnd())
        return InvalidArgument("malformed segment descriptor");
    return d;
}

const std::string& localHostId() {
    static const std::string id = [] {
        std::string boot;
        std::ifstream in("/proc/sys/kernel/random/boot_id");
        std::getline(in, boot);
        char ns[256] = {0};
        ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
        std::string net = n > 0 ? std::string(ns, static_cast<size_t>(n)) : "net:?";
        if (boot.empty()) {
            char host[256] = {0};
            ::gethostname(host, sizeof(host) - 1);
            boot = host;
        }
        return boot + "/" + net;
    }();
    return id;
}

}  // namespace mooncake::te
