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

TYPED_TEST(KVStoreTest, QueueIsFifoAndPopTimesOutWhenEmpty) {
    auto store = makeStore<TypeParam>();
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(store->queuePush("q", "m" + std::to_string(i)).ok());
    for (int i = 0; i < 5; ++i) {
        auto v = store->queuePop("q", Deadline::afterMs(1000));
        ASSERT_TRUE(v.ok()) << v.status().toString();
        EXPECT_EQ(v.value(), "m" + std::to_string(i));
    }
    auto empty = store->queuePop("q", Deadline::afterMs(50));
    ASSERT_FALSE(empty.ok());
    EXPECT_EQ(empty.status().code(), StatusCode::kTimeout);
}

TEST(FileKVStoreTest, QueueDeliversEachMessageOnceAcrossProcesses) {
    const std::string dir = tempDir();
    constexpr int kPerProducer = 50;
    constexpr int kProducers = 2;
    std::vector<pid_t> kids;
    for (int p = 0; p < kProducers; ++p) {
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            FileKVStore store(dir);
            for (int i = 0; i < kPerProducer; ++i) {
                if (!store.queuePush("mailbox", std::to_string(p * 1000 + i)).ok()) ::_exit(1);
            }
            ::_exit(0);
        }
        kids.push_back(pid);
    }
    FileKVStore store(dir);
    std::set<std::string> seen;
    for (int i = 0; i < kPerProducer * kProducers; ++i) {
        auto v = store.queuePop("mailbox", Deadline::afterMs(20000));
        ASSERT_TRUE(v.ok()) << v.status().toString();
        EXPECT_TRUE(seen.insert(v.value()).second) << "delivered twice: " << v.value();
    }
    for (pid_t pid : kids) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kPerProducer * kProducers));
}

}  // namespace
}  // namespace mooncake
