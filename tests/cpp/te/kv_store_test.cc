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
