// Shared-memory transport through the engine API: selection, byte-exact
// transfers across processes, direct mapping, the secret and bounds checks.
// Multi-process tests fork before any engine exists and coordinate through a
// FileKVStore; a child reports through its exit code. Failure handling (dead
// and stuck peers, hostile descriptors) is in shm_peer_failure_test.cc.
#include <spawn.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/common/crc32c.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "tests/cpp/te/shm_test_util.h"

extern char** environ;

namespace mooncake::te {
namespace {

using namespace shm_test;  // NOLINT(build/namespaces): test helpers only

// ---- selection ------------------------------------------------------------------

TEST(ShmTransport, SelectsShmOnlyForSharedMemoryOfSameHostPeer) {
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto a = startEngine(store, "a");
    auto b = startEngine(store, "b");
    auto forced = startEngine(store, "forced", kSecret, /*force_tcp=*/true);
    ASSERT_TRUE(a && b && forced);

    auto shared = b->allocateSharedMemory(1 << 20);
    ASSERT_TRUE(shared.ok()) << shared.status().toString();
    Buffer plain(1 << 16);
    ASSERT_TRUE(b->registerLocalMemory(plain.data, plain.size).ok());
    uint64_t shared_addr = reinterpret_cast<uint64_t>(shared.value());
    uint64_t plain_addr = reinterpret_cast<uint64_t>(plain.data);

    auto id = a->openSegment("b");
    ASSERT_TRUE(id.ok()) << id.status().toString();
    auto desc = a->segmentDesc(id.value());
    ASSERT_TRUE(desc.ok());
    EXPECT_FALSE(desc->shm_socket.empty());
    ASSERT_NE(desc->findRegion(shared_addr, 1), nullptr);
    EXPECT_FALSE(desc->findRegion(shared_addr, 1)->shm_export.empty());
    EXPECT_TRUE(desc->findRegion(plain_addr, 1)->shm_export.empty());

    auto t = a->transportFor(id.value(), shared_addr + 17, 4096);
    ASSERT_TRUE(t.ok()) << t.status().toString();
    EXPECT_EQ(t.value(), "shm");
    t = a->transportFor(id.value(), plain_addr, 4096);
    ASSERT_TRUE(t.ok()) << t.status().toString();
    EXPECT_EQ(t.value(), "tcp");
    EXPECT_FALSE(a->mapRemote(id.value(), plain_addr, 64).ok());

    auto fid = forced->openSegment("b");
    ASSERT_TRUE(fid.ok());
    t = forced->transportFor(fid.value(), shared_addr, 4096);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t.value(), "tcp");
    EXPECT_FALSE(forced->mapRemote(fid.value(), shared_addr, 64).ok());
}

// MC_FORCE_TCP is read once per process, so the check runs in a fresh copy of
// this binary started with the variable set.
TEST(ShmTransport, ForceTcpEnvironmentSelectsTcp) {
    if (std::getenv("MC_SHM_TEST_ENV_CHILD")) {
        TempDir dir;
        auto store = std::make_shared<FileKVStore>(dir.path());
        auto a = startEngine(store, "a");
        auto b = startEngine(store, "b");
        ASSERT_TRUE(a && b);
        auto shared = b->allocateSharedMemory(1 << 16);
        ASSERT_TRUE(shared.ok());
        auto id = a->openSegment("b");
        ASSERT_TRUE(id.ok());
        auto t = a->transportFor(id.value(), reinterpret_cast<uint64_t>(shared.value()), 64);
        ASSERT_TRUE(t.ok());
        EXPECT_EQ(t.value(), "tcp");
        return;
    }
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
        env.emplace_back(*e);
    env.emplace_back("MC_FORCE_TCP=1");
    env.emplace_back("MC_SHM_TEST_ENV_CHILD=1");
    std::vector<char*> envp;
    for (auto& s : env)
        envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
    std::string filter = "--gtest_filter=ShmTransport.ForceTcpEnvironmentSelectsTcp";
    char* argv[] = {exe.data(), filter.data(), nullptr};
    std::fflush(nullptr);
    pid_t pid = -1;
    ASSERT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    Child child(pid);
    EXPECT_EQ(child.wait(Deadline::afterMs(kWaitMs)), 0);
}

// ---- data path across processes ---------------------------------------------------

TEST(ShmTransport, WriteAndReadAreByteExactFromOneByteTo256MiB) {
    constexpr uint64_t kMax = 256ull << 20;
    constexpr uint64_t kTargetLen = kMax + 8192;
    TempDir dir;
    Child child([&] {
        auto store = std::make_shared<FileKVStore>(dir.path());
        auto e = startEngine(store, "target");
        CHILD_CHECK(e);
        auto mem = e->allocateSharedMemory(kTargetLen);
        CHILD_CHECK(mem.ok());
        CHILD_OK(store->set("target/addr", std::to_string(reinterpret_cast<uint64_t>(*mem))));
        CHILD_CHECK(waitKey(*store, "initiator/done") == "done");
        // The owner's own view of what the initiator wrote.
        uint32_t crc = crc32c(0, *mem, kTargetLen);
        CHILD_OK(store->set("target/crc", std::to_string(crc)));
        return 0;
    });
    ASSERT_TRUE(child.ok());

    auto store = std::make_shared<FileKVStore>(dir.path());
    auto e = startEngine(store, "initiator");
    ASSERT_TRUE(e);
    Buffer src(kMax + 64), dst(kMax + 64);
    ASSERT_TRUE(e->registerLocalMemory(src.data, src.size).ok());
    ASSERT_TRUE(e->registerLocalMemory(dst.data, dst.size).ok());
    auto id = e->openSegment("target");
    ASSERT_TRUE(id.ok()) << id.status().toString();
    uint64_t base = waitAddr(*store, "target/addr");
    ASSERT_NE(base, 0u);
    auto tr = e->transportFor(id.value(), base, kTargetLen);
    ASSERT_TRUE(tr.ok());
    ASSERT_EQ(tr.value(), "shm");
    auto view_ptr = e->mapRemote(id.value(), base, kTargetLen);
    ASSERT_TRUE(view_ptr.ok()) << view_ptr.status().toString();
    char* view = static_cast<char*>(view_ptr.value());

    const uint64_t sizes[] = {1,
                              2,
                              3,
                              7,
                              63,
                              64,
                              4095,
                              4097,
                              65537,
                              1ull << 20,
                              (1 << 20) + 3,
                              16 << 20,
                              (16 << 20) + 5,
                              kMax};
    for (uint64_t size : sizes) {
        SCOPED_TRACE("size " + std::to_string(size));
        const uint64_t src_off = 1 + size % 13;
        const uint64_t tgt_off = 4096 - 3 + size % 7;  // straddles a page boundary
        ASSERT_LE(tgt_off + size + 1, kTargetLen);
        view[tgt_off - 1] = '\x5a';
        view[tgt_off + size] = '\x5b';
        fillPattern(src.data + src_off, size, size);
        ASSERT_TRUE(transfer(*e, TransferOpcode::kWrite, src.data + src_off, id.value(),
                             base + tgt_off, size)
                        .ok());
        ASSERT_EQ(std::memcmp(view + tgt_off, src.data + src_off, size), 0);
        EXPECT_EQ(view[tgt_off - 1], '\x5a');
        EXPECT_EQ(view[tgt_off + size], '\x5b');

        const uint64_t dst_off = 5 + size % 11;
        dst.data[dst_off - 1] = '\x11';
        dst.data[dst_off + size] = '\x22';
        ASSERT_TRUE(transfer(*e, TransferOpcode::kRead, dst.data + dst_off, id.value(),
                             base + tgt_off, size)
                        .ok());
        ASSERT_EQ(std::memcmp(dst.data + dst_off, src.data + src_off, size), 0);
        EXPECT_EQ(dst.data[dst_off - 1], '\x11');
        EXPECT_EQ(dst.data[dst_off + size], '\x22');
    }
    uint32_t crc = crc32c(0, view, kTargetLen);
    ASSERT_TRUE(store->set("initiator/done", "done").ok());
    EXPECT_EQ(waitKey(*store, "target/crc"), std::to_string(crc));
    EXPECT_EQ(child.wait(Deadline::afterMs(kWaitMs)), 0);
}

TEST(ShmTransport, HundredsOfConcurrentRequests) {
    constexpr int kThreads = 4;
    constexpr int kPerBatch = 64;
    constexpr int kBatches = 2;
    constexpr uint64_t kSlot = 4096 + 1;  // odd: no request starts page-aligned
    constexpr uint64_t kSlots = kThreads * kPerBatch * kBatches;
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto owner = startEngine(store, "owner");
    auto user = startEngine(store, "user");
    ASSERT_TRUE(owner && user);
    auto remote = owner->allocateSharedMemory(kSlots * kSlot + 64);
    ASSERT_TRUE(remote.ok());
    const uint64_t base = reinterpret_cast<uint64_t>(remote.value()) + 3;
    Buffer src(kSlots * kSlot), back(kSlots * kSlot);
    ASSERT_TRUE(user->registerLocalMemory(src.data, src.size).ok());
    ASSERT_TRUE(user->registerLocalMemory(back.data, back.size).ok());
    fillPattern(src.data, src.size, 42);
    auto id = user->openSegment("owner");
    ASSERT_TRUE(id.ok());

    // Each thread moves its own slots, in batches of many requests, while the
    // others do the same; then it reads them all back in one batch.
    std::vector<Status> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            auto run = [&](TransferOpcode op, char* local, int first, int count) -> Status {
                MC_ASSIGN_OR_RETURN(BatchID b, user->allocateBatchID(count));
                std::vector<TransferRequest> reqs;
                for (int i = first; i < first + count; ++i) {
                    reqs.push_back({op, local + i * kSlot, id.value(), base + i * kSlot, kSlot});
                }
                Status st = user->submitTransfer(b, reqs);
                if (st.ok())
                    st = user->waitBatch(b, Deadline::afterMs(kWaitMs));
                (void)user->freeBatchID(b);
                return st;
            };
            const int first = t * kPerBatch * kBatches;
            Status st;
            for (int b = 0; b < kBatches && st.ok(); ++b) {
                st = run(TransferOpcode::kWrite, src.data, first + b * kPerBatch, kPerBatch);
            }
            if (st.ok())
                st = run(TransferOpcode::kRead, back.data, first, kPerBatch * kBatches);
            results[t] = st;
        });
    }
    for (auto& th : threads)
        th.join();
    for (const auto& st : results)
        EXPECT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(std::memcmp(back.data, src.data, src.size), 0);
    EXPECT_EQ(std::memcmp(reinterpret_cast<char*>(base), src.data, src.size), 0);
}

TEST(ShmTransport, MappedPointerStoresAreSeenByThePeer) {
    constexpr uint64_t kLen = 1 << 20;
    constexpr uint64_t kOff = 100;        // where the user stores
    constexpr uint64_t kOwnerOff = 9000;  // where the owner stores
    constexpr uint64_t kN = 5000;
    TempDir dir;
    Child child([&] {
        auto store = std::make_shared<FileKVStore>(dir.path());
        auto e = startEngine(store, "owner");
        CHILD_CHECK(e);
        auto mem = e->allocateSharedMemory(kLen);
        CHILD_CHECK(mem.ok());
        char* p = static_cast<char*>(*mem);
        CHILD_OK(store->set("owner/addr", std::to_string(reinterpret_cast<uint64_t>(p))));
        CHILD_CHECK(waitKey(*store, "user/stored") == "1");
        std::vector<char> want(kN);
        fillPattern(want.data(), kN, 7);
        bool seen =
            std::memcmp(p + kOff, want.data(), kN) == 0 && p[kOff - 1] == 0 && p[kOff + kN] == 0;
        fillPattern(p + kOwnerOff, kN, 8);
        CHILD_OK(store->set("owner/verified", seen ? "ok" : "bad"));
        CHILD_CHECK(waitKey(*store, "user/done") == "1");
        return 0;
    });
    ASSERT_TRUE(child.ok());
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto e = startEngine(store, "user");
    ASSERT_TRUE(e);
    auto id = e->openSegment("owner");
    ASSERT_TRUE(id.ok());
    uint64_t base = waitAddr(*store, "owner/addr");
    ASSERT_NE(base, 0u);

    auto p = e->mapRemote(id.value(), base + kOff, kN);
    ASSERT_TRUE(p.ok()) << p.status().toString();
    fillPattern(static_cast<char*>(p.value()), kN, 7);
    // A second range of the same allocation comes from the same mapping.
    auto q = e->mapRemote(id.value(), base + kOwnerOff, kN);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(static_cast<char*>(q.value()) - static_cast<char*>(p.value()),
              static_cast<std::ptrdiff_t>(kOwnerOff - kOff));
    ASSERT_TRUE(store->set("user/stored", "1").ok());
    EXPECT_EQ(waitKey(*store, "owner/verified"), "ok");
    std::vector<char> want(kN);
    fillPattern(want.data(), kN, 8);
    EXPECT_EQ(std::memcmp(q.value(), want.data(), kN), 0);
    ASSERT_TRUE(store->set("user/done", "1").ok());
    EXPECT_EQ(child.wait(Deadline::afterMs(kWaitMs)), 0);
}

// ---- refusals --------------------------------------------------------------------

TEST(ShmTransport, WrongSecretIsRefused) {
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto owner = startEngine(store, "owner", "right secret");
    auto intruder = startEngine(store, "intruder", "wrong secret");
    ASSERT_TRUE(owner && intruder);
    auto mem = owner->allocateSharedMemory(1 << 16);
    ASSERT_TRUE(mem.ok());
    char* p = static_cast<char*>(mem.value());
    std::memset(p, 0x5a, 1 << 16);
    const uint64_t addr = reinterpret_cast<uint64_t>(p);
    Buffer src(4096);
    std::memset(src.data, 0x11, src.size);
    ASSERT_TRUE(intruder->registerLocalMemory(src.data, src.size).ok());
    auto id = intruder->openSegment("owner");
    ASSERT_TRUE(id.ok());
    ASSERT_EQ(intruder->transportFor(id.value(), addr, 4096).value(), "shm");

    EXPECT_FALSE(intruder->mapRemote(id.value(), addr, 4096).ok());
    Status st = transfer(*intruder, TransferOpcode::kWrite, src.data, id.value(), addr, 4096);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
    st = transfer(*intruder, TransferOpcode::kRead, src.data, id.value(), addr, 4096);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
    EXPECT_TRUE(allBytes(p, 1 << 16, 0x5a));
    EXPECT_TRUE(allBytes(src.data, src.size, 0x11));
}

TEST(ShmTransport, OutOfRangeTargetFailsAndWritesNothing) {
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto owner = startEngine(store, "owner");
    auto user = startEngine(store, "user");
    ASSERT_TRUE(owner && user);
    // A three-page allocation of which only the middle page is registered, so
    // a stray write would land in mapped memory rather than fault.
    auto mem = owner->allocateSharedMemory(3 * 4096);
    ASSERT_TRUE(mem.ok());
    char* p = static_cast<char*>(mem.value());
    ASSERT_TRUE(owner->unregisterLocalMemory(p).ok());
    ASSERT_TRUE(owner->registerLocalMemory(p + 4096, 4096).ok());
    std::memset(p, 0x33, 3 * 4096);
    const uint64_t region = reinterpret_cast<uint64_t>(p) + 4096;

    Buffer src(3 * 4096);
    std::memset(src.data, 0x44, src.size);
    ASSERT_TRUE(user->registerLocalMemory(src.data, src.size).ok());
    auto id = user->openSegment("owner");
    ASSERT_TRUE(id.ok());

    struct Case {
        uint64_t addr, len;
    } bad[] = {{region + 4096 - 10, 20}, {region - 1, 2},    {region - 4096, 4096},
               {region, 4097},           {region + 4096, 1}, {region + 1, UINT64_MAX}};
    for (const auto& c : bad) {
        SCOPED_TRACE(std::to_string(c.addr - region) + " +" + std::to_string(c.len));
        EXPECT_FALSE(
            transfer(*user, TransferOpcode::kWrite, src.data, id.value(), c.addr, c.len).ok());
        EXPECT_FALSE(user->mapRemote(id.value(), c.addr, c.len).ok());
    }
    EXPECT_TRUE(allBytes(p, 3 * 4096, 0x33));
    // The same path works for an in-range request.
    ASSERT_TRUE(transfer(*user, TransferOpcode::kWrite, src.data, id.value(), region, 4096).ok());
    EXPECT_TRUE(allBytes(p, 4096, 0x33));
    EXPECT_TRUE(allBytes(p + 4096, 4096, 0x44));
    EXPECT_TRUE(allBytes(p + 8192, 4096, 0x33));
}

}  // namespace
}  // namespace mooncake::te
