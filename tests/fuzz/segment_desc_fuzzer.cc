// Fuzzes SegmentDesc::parse, which reads descriptors other processes publish
// in the metadata store. It must reject or accept any bytes without reading
// out of bounds or allocating without bound, and what it accepts must be
// canonical up to the one lossy field (a non-zero `remote_accessible` byte
// reads as true): re-serializing gives the same length and re-parses to the
// same descriptor. findRegion() must then only return regions that really
// contain the range asked for, with no wrap-around at the top of memory.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/engine/segment.h"
#include "tests/fuzz/fuzz_require.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using mooncake::te::RegionDesc;
using mooncake::te::SegmentDesc;

bool sameDesc(const SegmentDesc& a, const SegmentDesc& b) {
    if (a.name != b.name || a.host_id != b.host_id || a.pid != b.pid ||
        a.generation != b.generation || a.tcp_host != b.tcp_host || a.tcp_port != b.tcp_port ||
        a.shm_socket != b.shm_socket || a.rdma_endpoint != b.rdma_endpoint ||
        a.regions.size() != b.regions.size())
        return false;
    for (size_t i = 0; i < a.regions.size(); ++i) {
        const RegionDesc& x = a.regions[i];
        const RegionDesc& y = b.regions[i];
        if (x.addr != y.addr || x.length != y.length || x.location != y.location ||
            x.remote_accessible != y.remote_accessible || x.shm_export != y.shm_export ||
            x.cuda_ipc_export != y.cuda_ipc_export || x.rdma_export != y.rdma_export)
            return false;
    }
    return true;
}

// [addr, addr + len) inside [r.addr, r.addr + r.length), in 128-bit
// arithmetic so that nothing can wrap.
bool reallyContains(const RegionDesc& r, uint64_t addr, uint64_t len) {
    using u128 = unsigned __int128;
    return addr >= r.addr && u128{addr} + len <= u128{r.addr} + r.length;
}

void checkLookups(const SegmentDesc& d) {
    for (const RegionDesc& r : d.regions) {
        // Probes at and around the region's edges, where overflow bites.
        const uint64_t probes[][2] = {
            {r.addr, r.length},
            {r.addr, r.length + 1},
            {r.addr + r.length, 1},
            {r.addr - 1, 1},
            {r.addr + 1, r.length - 1},
            {r.addr + 1, UINT64_MAX},
            {r.addr + r.length - 1, 2},
            {UINT64_MAX, 1},
            {r.addr, 0},
        };
        for (const auto& p : probes) {
            const RegionDesc* hit = d.findRegion(p[0], p[1]);
            if (hit != nullptr)
                MC_FUZZ_REQUIRE(reallyContains(*hit, p[0], p[1]));
            MC_FUZZ_REQUIRE(r.contains(p[0], p[1]) == reallyContains(r, p[0], p[1]));
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto parsed = SegmentDesc::parse(bytes);
    if (!parsed.ok())
        return 0;
    const SegmentDesc& d = parsed.value();
    const std::string again = d.serialize();
    MC_FUZZ_REQUIRE(again.size() == bytes.size());
    auto reparsed = SegmentDesc::parse(again);
    MC_FUZZ_REQUIRE(reparsed.ok() && sameDesc(reparsed.value(), d));
    MC_FUZZ_REQUIRE(reparsed.value().serialize() == again);
    checkLookups(d);
    return 0;
}

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    SegmentDesc d;
    d.name = "seg";
    d.host_id = "boot/net:[1]";
    d.pid = 42;
    d.generation = 3;
    d.tcp_host = "127.0.0.1";
    d.tcp_port = 7000;
    d.shm_socket = "@mc";
    d.rdma_endpoint = "endpoint";
    std::vector<std::string> out = {d.serialize()};
    d.regions.push_back(RegionDesc{0x1000, 0x2000, "cpu", true, "shm-export", "", "rkey"});
    d.regions.push_back(RegionDesc{UINT64_MAX - 0xff, 0x100, "cuda:0", false, "", "ipc", ""});
    out.push_back(d.serialize());
    return out;
}

}  // namespace mooncake::fuzz
