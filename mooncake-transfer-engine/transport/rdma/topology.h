// PCIe topology from sysfs, for get_preferred_hca: which HCAs sit closest to
// a GPU. The sysfs root is a constructor argument so tests build a fake tree
// (directories and symlinks) instead of needing hardware.
//
// A device's PCI path is the chain of bridges from its root complex down to
// it, read from the target of <root>/class/infiniband/<hca>/device or
// <root>/bus/pci/devices/<bus id>: ["pci0000:00", "0000:00:01.0",
// "0000:01:00.0"]. The distance of two devices is the number of links between
// them through their lowest common bridge; devices under different root
// complexes are kCrossRootDistance plus that (traffic crosses the CPU
// interconnect), and more again across NUMA nodes.
#pragma once

#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

inline constexpr int kCrossRootDistance = 1000;
inline constexpr int kCrossNumaDistance = 2000;

struct PciLocation {
    std::vector<std::string> path;  // root complex first, the device last
    int numa_node = -1;             // -1 when sysfs does not say
};

// Links between a and b (see above); 0 for the same device.
int pciDistance(const PciLocation& a, const PciLocation& b);

// "0000:3B:00.0" or nvidia's "00000000:3b:00.0" → "0000:3b:00.0";
// kInvalidArgument naming the value unless it is domain:bus:device.function.
Result<std::string> normalizePciBusId(const std::string& bus_id);

class SysfsTopology {
public:
    explicit SysfsTopology(std::string root = "/sys");

    // The names under <root>/class/infiniband, sorted; empty when none.
    std::vector<std::string> hcaNames() const;
    Result<PciLocation> hca(const std::string& name) const;
    Result<PciLocation> pciDevice(const std::string& bus_id) const;

    // The HCAs among `hcas` nearest to the PCI device `bus_id` (all at the
    // minimal distance, in the order given). HCAs whose location sysfs does not
    // tell are skipped; if none is known the input comes back unchanged.
    Result<std::vector<std::string>> nearestHcas(const std::string& bus_id,
                                                 const std::vector<std::string>& hcas) const;
    // The HCAs on NUMA node `node`, or all when none is (or sysfs does not tell).
    std::vector<std::string> hcasOnNumaNode(int node, const std::vector<std::string>& hcas) const;

private:
    Result<PciLocation> locate(const std::string& link, const std::string& what) const;
    std::string root_;
};

}  // namespace mooncake::te::rdma
