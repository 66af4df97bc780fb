#include "mooncake-transfer-engine/transport/rdma/topology.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <fstream>

namespace mooncake::te::rdma {

namespace {

bool isHex(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isxdigit(static_cast<unsigned char>(c));
    });
}

// "dddd:bb:dd.f" or a root complex "pcidddd:bb".
bool isPciComponent(const std::string& c) {
    if (c.rfind("pci", 0) == 0)
        return c.size() > 3 && c.find(':') != std::string::npos;
    auto bus_id = normalizePciBusId(c);
    return bus_id.ok();
}

std::string lower(std::string s) {
    for (char& c : s)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

int pciDistance(const PciLocation& a, const PciLocation& b) {
    size_t common = 0;
    while (common < a.path.size() && common < b.path.size() && a.path[common] == b.path[common])
        ++common;
    const int hops = static_cast<int>((a.path.size() - common) + (b.path.size() - common));
    if (common > 0)
        return hops;
    if (a.numa_node >= 0 && b.numa_node >= 0 && a.numa_node != b.numa_node)
        return kCrossNumaDistance + hops;
    return kCrossRootDistance + hops;
}

Result<std::string> normalizePciBusId(const std::string& bus_id) {
    const std::string id = lower(bus_id);
    const auto bad = [&] {
        return InvalidArgument("PCI bus id '" + bus_id +
                               "' is not domain:bus:device.function (like '0000:3b:00.0')");
    };
    const size_t c1 = id.find(':');
    const size_t c2 = c1 == std::string::npos ? c1 : id.find(':', c1 + 1);
    const size_t dot = c2 == std::string::npos ? c2 : id.find('.', c2 + 1);
    if (dot == std::string::npos)
        return bad();
    std::string domain = id.substr(0, c1);
    const std::string bus = id.substr(c1 + 1, c2 - c1 - 1);
    const std::string dev = id.substr(c2 + 1, dot - c2 - 1);
    const std::string fn = id.substr(dot + 1);
    if (!isHex(domain) || domain.size() > 8 || !isHex(bus) || bus.size() != 2 || !isHex(dev) ||
        dev.size() != 2 || fn.size() != 1 || !std::isdigit(static_cast<unsigned char>(fn[0])))
        return bad();
    // nvidia prints an 8-digit domain; sysfs uses 4 when the upper half is zero.
    while (domain.size() > 4 && domain[0] == '0')
        domain.erase(0, 1);
    while (domain.size() < 4)
        domain.insert(0, "0");
    return domain + ":" + bus + ":" + dev + "." + fn;
}

SysfsTopology::SysfsTopology(std::string root) : root_(std::move(root)) {}

std::vector<std::string> SysfsTopology::hcaNames() const {
    std::vector<std::string> out;
    DIR* dir = ::opendir((root_ + "/class/infiniband").c_str());
    if (!dir)
        return out;
    while (dirent* e = ::readdir(dir)) {
        std::string name = e->d_name;
        if (name != "." && name != "..")
            out.push_back(std::move(name));
    }
    ::closedir(dir);
    std::sort(out.begin(), out.end());
    return out;
}

Result<PciLocation> SysfsTopology::locate(const std::string& link, const std::string& what) const {
    char resolved[PATH_MAX];
    if (!::realpath(link.c_str(), resolved))
        return NotFound(what + ": " + link + " does not resolve");
    PciLocation loc;
    std::string path = resolved;
    size_t start = 0;
    while (start < path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string::npos)
            end = path.size();
        std::string component = path.substr(start, end - start);
        if (isPciComponent(component))
            loc.path.push_back(lower(component));
        start = end + 1;
    }
    if (loc.path.empty())
        return NotFound(what + ": " + std::string(resolved) + " is not under a PCI root complex");
    std::ifstream numa(std::string(resolved) + "/numa_node");
    if (!(numa >> loc.numa_node))
        loc.numa_node = -1;
    return loc;
}

Result<PciLocation> SysfsTopology::hca(const std::string& name) const {
    return locate(root_ + "/class/infiniband/" + name + "/device", "HCA " + name);
}

Result<PciLocation> SysfsTopology::pciDevice(const std::string& bus_id) const {
    MC_ASSIGN_OR_RETURN(std::string id, normalizePciBusId(bus_id));
    return locate(root_ + "/bus/pci/devices/" + id, "PCI device " + id);
}

Result<std::vector<std::string>> SysfsTopology::nearestHcas(
    const std::string& bus_id, const std::vector<std::string>& hcas) const {
    MC_ASSIGN_OR_RETURN(PciLocation target, pciDevice(bus_id));
    int best = INT_MAX;
    std::vector<std::string> out;
    for (const std::string& name : hcas) {
        auto loc = hca(name);
        if (!loc.ok())
            continue;
        const int d = pciDistance(target, loc.value());
        if (d < best) {
            best = d;
            out.clear();
        }
        if (d == best)
            out.push_back(name);
    }
    if (out.empty())
        return hcas;
    return out;
}

std::vector<std::string> SysfsTopology::hcasOnNumaNode(int node,
                                                       const std::vector<std::string>& hcas) const {
    std::vector<std::string> out;
    for (const std::string& name : hcas) {
        auto loc = hca(name);
        if (loc.ok() && loc->numa_node == node)
            out.push_back(name);
    }
    return out.empty() ? hcas : out;
}

}  // namespace mooncake::te::rdma
