// The tests' driver for forked device-group ranks (device_group_util.h).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "tests/cpp/pg_device/device_group_util.h"

namespace mooncake::pg::device::test {

// Runs body(rank) in `size` children; every exit code must be 0.
inline void runRanks(int size, const std::function<int(int)>& body) {
    std::vector<std::unique_ptr<Child>> children;
    for (int r = 0; r < size; ++r)
        children.push_back(std::make_unique<Child>([&, r] { return body(r); }));
    for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(children[r]->ok());
        EXPECT_EQ(children[r]->wait(Deadline::afterMs(6 * kWaitMs)), 0) << "rank " << r;
    }
}

}  // namespace mooncake::pg::device::test
