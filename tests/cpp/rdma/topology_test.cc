// get_preferred_hca's topology scoring on a fake sysfs tree: directories for
// the PCI hierarchy, symlinks where the kernel has them, numa_node files.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/topology.h"

namespace mooncake::te::rdma {
namespace {

namespace fs = std::filesystem;

// Two root complexes on two NUMA nodes:
//   pci0000:00 (node 0) ─ 00:01.0 ─ 01:00.0 (switch) ┬ 02:00.0  GPU A
//                       │                            └ 02:01.0  mlx5_0
//                       └ 00:02.0 ─ 03:00.0  mlx5_1
//   pci0000:80 (node 1) ─ 80:01.0 ┬ 81:00.0  mlx5_2
//                                 └ 81:00.1  GPU B
//   pci0000:40 (node 0) ─ 40:01.0 ─ 41:00.0  mlx5_3
class FakeSysfs : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/mc_sysfs_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        root_ = tmpl;
        device("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0", 0);
        hca("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0", 0);
        hca("mlx5_1", "pci0000:00/0000:00:02.0/0000:03:00.0", 0);
        hca("mlx5_2", "pci0000:80/0000:80:01.0/0000:81:00.0", 1);
        device("pci0000:80/0000:80:01.0/0000:81:00.1", 1);
        hca("mlx5_3", "pci0000:40/0000:40:01.0/0000:41:00.0", 0);
    }
    void TearDown() override { fs::remove_all(root_); }

    // A PCI device directory, with its /sys/bus/pci/devices link.
    void device(const std::string& path, int numa) {
        const fs::path dir = fs::path(root_) / "devices" / path;
        fs::create_directories(dir);
        std::ofstream(dir / "numa_node") << numa << "\n";
        fs::create_directories(fs::path(root_) / "bus/pci/devices");
        fs::create_directory_symlink(dir, fs::path(root_) / "bus/pci/devices" / dir.filename());
    }
    void hca(const std::string& name, const std::string& path, int numa) {
        device(path, numa);
        const fs::path cls = fs::path(root_) / "class/infiniband" / name;
        fs::create_directories(cls);
        // Relative, as the kernel makes it.
        fs::create_directory_symlink(fs::path("../../../devices") / path, cls / "device");
    }

    std::string root_;
};

TEST_F(FakeSysfs, ReadsPciPathsAndNumaNodes) {
    SysfsTopology topo(root_);
    EXPECT_EQ(topo.hcaNames(), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}));
    auto loc = topo.hca("mlx5_0");
    ASSERT_TRUE(loc.ok()) << loc.status().toString();
    EXPECT_EQ(loc->path, (std::vector<std::string>{"pci0000:00", "0000:00:01.0", "0000:01:00.0",
                                                   "0000:02:01.0"}));
    EXPECT_EQ(loc->numa_node, 0);
    EXPECT_EQ(topo.hca("mlx5_2")->numa_node, 1);
    EXPECT_EQ(topo.hca("mlx5_9").status().code(), StatusCode::kNotFound);
}

TEST_F(FakeSysfs, DistancesCountLinksThroughTheCommonBridge) {
    SysfsTopology topo(root_);
    const PciLocation gpu_a = topo.pciDevice("0000:02:00.0").value();
    const PciLocation gpu_b = topo.pciDevice("0000:81:00.1").value();
    EXPECT_EQ(pciDistance(gpu_a, gpu_a), 0);
    EXPECT_EQ(pciDistance(gpu_a, topo.hca("mlx5_0").value()), 2);  // same switch
    EXPECT_EQ(pciDistance(gpu_a, topo.hca("mlx5_1").value()), 5);  // same root complex
    // Another root complex on the same NUMA node; then another NUMA node.
    EXPECT_EQ(pciDistance(gpu_a, topo.hca("mlx5_3").value()), kCrossRootDistance + 4 + 3);
    EXPECT_EQ(pciDistance(gpu_a, topo.hca("mlx5_2").value()), kCrossNumaDistance + 4 + 3);
    EXPECT_EQ(pciDistance(gpu_b, topo.hca("mlx5_2").value()), 2);
}

TEST_F(FakeSysfs, NearestHcas) {
    SysfsTopology topo(root_);
    const std::vector<std::string> all = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
    EXPECT_EQ(topo.nearestHcas("0000:02:00.0", all).value(), std::vector<std::string>{"mlx5_0"});
    // nvidia's 8-digit domain and upper case.
    EXPECT_EQ(topo.nearestHcas("00000000:81:00.1", all).value(),
              std::vector<std::string>{"mlx5_2"});
    EXPECT_EQ(topo.nearestHcas("0000:02:00.0", {"mlx5_1", "mlx5_2", "mlx5_3"}).value(),
              std::vector<std::string>{"mlx5_1"});
    // Filtered down to the far side: still an answer, the nearest of those.
    EXPECT_EQ(topo.nearestHcas("0000:02:00.0", {"mlx5_2", "mlx5_3"}).value(),
              std::vector<std::string>{"mlx5_3"});
    // HCAs sysfs does not know come back unchanged rather than vanish.
    EXPECT_EQ(topo.nearestHcas("0000:02:00.0", {"ghost0", "ghost1"}).value(),
              (std::vector<std::string>{"ghost0", "ghost1"}));
    EXPECT_EQ(topo.nearestHcas("0000:09:00.0", all).status().code(), StatusCode::kNotFound);
}

TEST_F(FakeSysfs, TiesReturnEveryNearestHca) {
    hca("mlx5_4", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0", 0);
    SysfsTopology topo(root_);
    EXPECT_EQ(topo.nearestHcas("0000:02:00.0", {"mlx5_1", "mlx5_4", "mlx5_0"}).value(),
              (std::vector<std::string>{"mlx5_4", "mlx5_0"}));
}

TEST_F(FakeSysfs, NumaNodes) {
    SysfsTopology topo(root_);
    const std::vector<std::string> all = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};
    EXPECT_EQ(topo.hcasOnNumaNode(1, all), std::vector<std::string>{"mlx5_2"});
    EXPECT_EQ(topo.hcasOnNumaNode(0, all),
              (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_3"}));
    EXPECT_EQ(topo.hcasOnNumaNode(7, all), all);
}

TEST(Topology, EmptySysfs) {
    SysfsTopology topo("/nonexistent-sysfs");
    EXPECT_TRUE(topo.hcaNames().empty());
    EXPECT_EQ(topo.nearestHcas("0000:02:00.0", {"mlx5_0"}).status().code(), StatusCode::kNotFound);
}

TEST(Topology, NormalizesBusIds) {
    EXPECT_EQ(normalizePciBusId("0000:3B:00.0").value(), "0000:3b:00.0");
    EXPECT_EQ(normalizePciBusId("00000000:3b:1f.7").value(), "0000:3b:1f.7");
    EXPECT_EQ(normalizePciBusId("0001:3b:00.0").value(), "0001:3b:00.0");
    EXPECT_EQ(normalizePciBusId("10000:3b:00.0").value(), "10000:3b:00.0");
    for (const char* bad : {"", "3b:00.0", "0000:3b:00", "0000:3b:0.0", "0000:zz:00.0",
                            "0000:3b:00.a", "0000:3b:00.10", "123456789:3b:00.0"}) {
        auto r = normalizePciBusId(bad);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_EQ(r.status().message(), "PCI bus id '" + std::string(bad) +
                                            "' is not domain:bus:device.function (like "
                                            "'0000:3b:00.0')");
    }
}

}  // namespace
}  // namespace mooncake::te::rdma
