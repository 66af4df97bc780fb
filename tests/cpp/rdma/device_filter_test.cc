#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/device_filter.h"

namespace mooncake::te::rdma {
namespace {

using Entries = std::vector<DeviceFilterEntry>;

TEST(DeviceFilter, ParsesNamesAndPorts) {
    auto f = parseDeviceFilter(std::vector<std::string>{"mlx5_1", "mlx5_2:2", "irdma-0.x:255"});
    ASSERT_TRUE(f.ok()) << f.status().toString();
    EXPECT_EQ(f.value(), (Entries{{"mlx5_1", 0}, {"mlx5_2", 2}, {"irdma-0.x", 255}}));
    EXPECT_TRUE(parseDeviceFilter(std::vector<std::string>{}).value().empty());
}

TEST(DeviceFilter, ParsesCommaLists) {
    auto f = parseDeviceFilter(std::string_view(" mlx5_1 , mlx5_2:1"));
    ASSERT_TRUE(f.ok()) << f.status().toString();
    EXPECT_EQ(f.value(), (Entries{{"mlx5_1", 0}, {"mlx5_2", 1}}));
    EXPECT_TRUE(parseDeviceFilter(std::string_view("")).value().empty());
    EXPECT_EQ(parseDeviceFilter(std::string_view("mlx5_1,,mlx5_2")).status().message(),
              "device_filter 'mlx5_1,,mlx5_2' has an empty entry; expected names separated by ','");
    EXPECT_FALSE(parseDeviceFilter(std::string_view("mlx5_1,")).ok());
}

TEST(DeviceFilter, RejectsMalformedEntriesNamingThem) {
    const struct {
        std::vector<std::string> in;
        const char* message;
    } cases[] = {
        {{""},
         "device_filter entry '' has no device name; expected a name like 'mlx5_0' or 'mlx5_0:1'"},
        {{":1"},
         "device_filter entry ':1' has no device name; expected a name like 'mlx5_0' or "
         "'mlx5_0:1'"},
        {{"mlx5 0"},
         "device_filter entry 'mlx5 0' is not a device name; expected letters, digits, '_', '-' "
         "or '.', at most 63 characters (like 'mlx5_0')"},
        {{"mlx5_0:0"},
         "device_filter entry 'mlx5_0:0' has port '0'; expected a port number in 1..255 after ':'"},
        {{"mlx5_0:256"},
         "device_filter entry 'mlx5_0:256' has port '256'; expected a port number in 1..255 after "
         "':'"},
        {{"mlx5_0:"},
         "device_filter entry 'mlx5_0:' has port ''; expected a port number in 1..255 after ':'"},
        {{"mlx5_0:1a"},
         "device_filter entry 'mlx5_0:1a' has port '1a'; expected a port number in 1..255 after "
         "':'"},
        {{"mlx5_0", "mlx5_0:1"},
         "device_filter lists device 'mlx5_0' twice; expected each device at most once"},
    };
    for (const auto& c : cases) {
        auto f = parseDeviceFilter(c.in);
        ASSERT_FALSE(f.ok()) << c.message;
        EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(f.status().message(), c.message);
    }
    EXPECT_FALSE(parseDeviceFilter(std::vector<std::string>{std::string(64, 'a')}).ok());
    EXPECT_TRUE(parseDeviceFilter(std::vector<std::string>{std::string(63, 'a')}).ok());
}

TEST(DeviceFilter, AppliesInFilterOrder) {
    const std::vector<std::string> present = {"mlx5_0", "mlx5_1", "mlx5_2"};
    FilteredDevices all = applyDeviceFilter(present, {});
    EXPECT_EQ(all.selected, (Entries{{"mlx5_0", 0}, {"mlx5_1", 0}, {"mlx5_2", 0}}));
    EXPECT_TRUE(all.unmatched.empty());

    FilteredDevices some =
        applyDeviceFilter(present, {{"mlx5_2", 1}, {"mlx5_9", 0}, {"mlx5_0", 0}});
    EXPECT_EQ(some.selected, (Entries{{"mlx5_2", 1}, {"mlx5_0", 0}}));
    EXPECT_EQ(some.unmatched, std::vector<std::string>{"mlx5_9"});

    FilteredDevices none = applyDeviceFilter({}, {{"mlx5_1", 0}});
    EXPECT_TRUE(none.selected.empty());
    EXPECT_EQ(none.unmatched, std::vector<std::string>{"mlx5_1"});
}

}  // namespace
}  // namespace mooncake::te::rdma
