// KVStore implementations: values, counters, deadlines and queues.
#include "mooncake-transfer-engine/metadata/kv_store.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <future>
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

// The kernel's scheduling state of thread `tid` of this process ('R', 'S', ...).
char threadState(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string line;
    std::getline(in, line);
    // "tid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
    const size_t close = line.rfind(')');
    return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

TYPED_TEST(KVStoreTest, GetWakesWhenAnotherThreadSets) {
    auto store = makeStore<TypeParam>();
    // The set must happen while get() is already waiting, or this would only
    // test the fast path: the getter announces its thread id right before the
    // call, and the set waits until that thread sleeps (in get's wait, since
    // nothing else between the announcement and the call blocks). get()'s own
    // deadline is far beyond the bound on the wake-up, so a get that only
    // notices the value when its deadline passes fails here.
    std::atomic<pid_t> getter_tid{0};
    std::promise<Result<std::string>> result;
    std::future<Result<std::string>> got = result.get_future();
    std::thread getter([&] {
        const Deadline deadline = Deadline::afterMs(120000);
        getter_tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
        result.set_value(store->get("late", deadline));
    });
    const Deadline wait_limit = Deadline::afterMs(10000);
    bool sleeping = false;
    while (!wait_limit.expired() && !sleeping) {
        const pid_t tid = getter_tid.load();
        sleeping = tid != 0 && threadState(tid) == 'S';
        if (!sleeping)
            std::this_thread::yield();
    }
    EXPECT_TRUE(sleeping) << "the getter thread did not block in get() within 10 s";
    ASSERT_TRUE(store->set("late", "v").ok());
    const bool woke = got.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    getter.join();
    ASSERT_TRUE(woke) << "get() did not return within 30 s of the set (its deadline was 120 s)";
    Result<std::string> value = got.get();
    ASSERT_TRUE(value.ok()) << value.status().toString();
    EXPECT_EQ(value.value(), "v");
}

TYPED_TEST(KVStoreTest, AddCountsFromZero) {
    auto store = makeStore<TypeParam>();
    EXPECT_EQ(store->add("ctr", 1).value(), 1);
    EXPECT_EQ(store->add("ctr", 5).value(), 6);
    EXPECT_EQ(store->add("ctr", -2).value(), 4);
}

}  // namespace
}  // namespace mooncake
