// KVStore implementations: values, counters, deadlines and queues.
#include "mooncake-transfer-engine/metadata/kv_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <thread>

#include "mooncake-transfer-engine/common/random.h"

namespace mooncake {
namespace {

std::string tempDir() {
    std::string dir = "/tmp/mc-kv-test-" + randomHex(6);
    return dir;
}

template <typename Store>
std::unique_ptr<KVStore> makeStore();
template <>
std::unique_ptr<KVStore> makeStore<InProcessKVStore>() {
    return std::make_unique<InProcessKVStore>();
}
template <>
std::unique_ptr<KVStore> makeStore<FileKVStore>() {
    return std::make_unique<FileKVStore>(tempDir());
}

template <typename Store>
class KVStoreTest : public ::testing::Test {};
using StoreTypes = ::testing::Types<InProcessKVStore, FileKVStore>;
TYPED_TEST_SUITE(KVStoreTest, StoreTypes);

TYPED_TEST(KVStoreTest, SetGetRoundTripsBinaryValues) {
    auto store = makeStore<TypeParam>();
    std::string value("a\0b/c:d", 7);
    ASSERT_TRUE(store->set("group/0/key:1", value).ok());
    auto got = store->get("group/0/key:1", Deadline::afterMs(1000));
    ASSERT_TRUE(got.ok()) << got.status().toString();
    EXPECT_EQ(got.value(), value);
}

TYPED_TEST(KVStoreTest, GetOfMissingKeyTimesOutAtDeadline) {
    auto store = makeStore<TypeParam>();
    auto start = std::chrono::steady_clock::now();
    auto got = store->get("missing", Deadline::afterMs(100));
    auto waited = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kTimeout);
    EXPECT_GE(waited, std::chrono::milliseconds(100));
    EXPECT_LT(waited, std::chrono::seconds(5));
}

TYPED_TEST(KVStoreTest, GetWakesWhenAnotherThreadSets) {
    auto store = makeStore<TypeParam>();
    std::thread setter([&] { ASSERT_TRUE(store->set("late", "v").ok()); });
    auto got = store->get("late", Deadline::afterMs(10000));
    setter.join();
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got.value(), "v");
}

TYPED_TEST(KVStoreTest, AddCountsFromZero) {
    auto store = makeStore<TypeParam>();
    EXPECT_EQ(store->add("ctr", 1).value(), 1);
    EXPECT_EQ(store->add("ctr", 5).value(), 6);
    EXPECT_EQ(store->add("ctr", -2).value(), 4);
}

}  // namespace
}  // namespace mooncake
