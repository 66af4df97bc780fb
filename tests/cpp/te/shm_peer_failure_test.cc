// Shared-memory transport failure handling: the transport's own range and
// export checks (driven directly, with descriptors the engine would never
// produce), the secret, shutdown, and peers that die or stop mid-session.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/shm/fd_passing.h"
#include "mooncake-transfer-engine/transport/shm/peer_mappings.h"
#include "mooncake-transfer-engine/transport/shm/shm_protocol.h"
#include "mooncake-transfer-engine/transport/shm/shm_transport.h"
#include "mooncake-transfer-engine/transport/transport.h"
#include "tests/cpp/te/shm_test_util.h"

namespace mooncake::te {
namespace {

using namespace shm_test;  // NOLINT(build/namespaces): test helpers only

// The transport re-checks every range itself rather than trusting the
// engine's validation; drive it directly with descriptors the engine would
// never produce.
using test::FakeHost;

Status runTask(Transport& t, const SegmentDesc& peer, TransferOpcode op, void* src, uint64_t addr,
               uint64_t len) {
    auto task = std::make_shared<TransferTask>(TransferRequest{op, src, 1, addr, len},
                                               std::make_shared<const SegmentDesc>(peer));
    t.submit(task);
    if (!task->done())
        return Internal("shm submit returned before completing the task");
    return task->status().error;
}

TEST(ShmTransport, TransportRechecksRangesAndExports) {
    FakeHost owner_host("owner", kSecret), user_host("user", kSecret), bad_host("bad", "nope");
    auto owner = createShmTransport();
    auto user = createShmTransport();
    auto bad = createShmTransport();
    SegmentDesc desc, user_desc, bad_desc;
    ASSERT_TRUE(owner->start(&owner_host, &desc).ok());
    ASSERT_TRUE(user->start(&user_host, &user_desc).ok());
    ASSERT_TRUE(bad->start(&bad_host, &bad_desc).ok());
    desc.name = "owner";
    desc.host_id = localHostId();
    desc.pid = ::getpid();

    // Pages 0..2 allocated, page 1 registered and exported; page 0 of a second
    // allocation registered as private.
    auto alloc = owner_host.memory().allocateShared(3 * 4096, "t");
    auto priv = owner_host.memory().allocateShared(4096, "p");
    ASSERT_TRUE(alloc.ok() && priv.ok());
    char* p = reinterpret_cast<char*>(alloc->addr);
    std::memset(p, 0x33, 3 * 4096);
    LocalRegion lr{alloc->addr + 4096, 4096, "cpu", true};
    LocalRegion private_lr{priv->addr, 4096, "cpu", false};
    ASSERT_TRUE(owner_host.memory().add(lr).ok());
    ASSERT_TRUE(owner_host.memory().add(private_lr).ok());
    RegionDesc region{lr.addr, lr.length, "cpu", true, "", "", ""};
    ASSERT_TRUE(owner->exportRegion(lr, &region).ok());
    ASSERT_FALSE(region.shm_export.empty());
    RegionDesc private_region{private_lr.addr, 4096, "cpu", false, "", "", ""};
    ASSERT_TRUE(owner->exportRegion(private_lr, &private_region).ok());
    EXPECT_TRUE(private_region.shm_export.empty());
    desc.regions = {region};
    EXPECT_TRUE(user->canReach(desc, region));

    Buffer src(4 * 4096);
    std::memset(src.data, 0x44, src.size);
    auto write = [&](Transport& t, const SegmentDesc& d, uint64_t addr, uint64_t len) {
        return runTask(t, d, TransferOpcode::kWrite, src.data, addr, len);
    };
    // Outside the region but inside the allocation: refused.
    EXPECT_EQ(write(*user, desc, lr.addr - 1, 2).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(write(*user, desc, lr.addr + 4095, 2).code(), StatusCode::kOutOfRange);
    EXPECT_FALSE(user->mapPeerMemory(desc, region, lr.addr + 1, 4096).ok());

    // A region claiming more than its allocation holds (past the mapping).
    SegmentDesc forged = desc;
    forged.regions[0].length = 3 * 4096;
    EXPECT_FALSE(write(*user, forged, lr.addr + 4096, 8192).ok());
    // An export that inflates the allocation: the owner's reply disagrees.
    forged = desc;
    forged.regions[0].shm_export = encodeShmExport({alloc->id, alloc->addr, alloc->length * 4});
    EXPECT_FALSE(write(*user, forged, lr.addr, 16).ok());
    // Garbage, unknown ids and private allocations.
    forged.regions[0].shm_export = "garbage";
    EXPECT_EQ(write(*user, forged, lr.addr, 16).code(), StatusCode::kInvalidArgument);
    forged.regions[0].shm_export = encodeShmExport({999, alloc->addr, alloc->length});
    EXPECT_EQ(write(*user, forged, lr.addr, 16).code(), StatusCode::kNotFound);
    forged.regions = {private_region};
    forged.regions[0].remote_accessible = true;
    forged.regions[0].shm_export = encodeShmExport({priv->id, priv->addr, priv->length});
    EXPECT_EQ(write(*user, forged, priv->addr, 16).code(), StatusCode::kNotFound);
    // Wrong secret.
    EXPECT_EQ(write(*bad, desc, lr.addr, 16).code(), StatusCode::kPermissionDenied);
    EXPECT_EQ(bad->probe(desc, Deadline::afterMs(5000)).code(), StatusCode::kPermissionDenied);
    EXPECT_TRUE(allBytes(p, 3 * 4096, 0x33));

    // The genuine request succeeds and touches only its bytes.
    ASSERT_TRUE(write(*user, desc, lr.addr + 1, 4094).ok());
    EXPECT_TRUE(allBytes(p, 4097, 0x33));
    EXPECT_TRUE(allBytes(p + 4097, 4094, 0x44));
    EXPECT_TRUE(allBytes(p + 8191, 4097, 0x33));
    EXPECT_TRUE(user->probe(desc, Deadline::afterMs(5000)).ok());

    // Once the owner is gone its socket refuses at once; mapped memory stays
    // usable. Shutdown is idempotent and fails later work with kAborted.
    owner->shutdown();
    owner->shutdown();
    EXPECT_EQ(user->probe(desc, Deadline::afterMs(5000)).code(), StatusCode::kUnavailable);
    EXPECT_TRUE(write(*user, desc, lr.addr, 16).ok());
    user->shutdown();
    user->shutdown();
    EXPECT_EQ(write(*user, desc, lr.addr, 16).code(), StatusCode::kAborted);
}

// The owner's socket, spoken to directly: several requests per connection,
// and a connection dropped after a malformed request or a wrong secret.
TEST(ShmTransport, ServerAnswersSeveralRequestsAndDropsBadClients) {
    FakeHost host("owner", kSecret);
    auto owner = createShmTransport();
    SegmentDesc desc;
    ASSERT_TRUE(owner->start(&host, &desc).ok());
    auto alloc = host.memory().allocateShared(4096, "t");
    ASSERT_TRUE(alloc.ok());
    ASSERT_TRUE(host.memory().add({alloc->addr, 4096, "cpu", true}).ok());
    const Deadline deadline = Deadline::afterMs(kWaitMs);
    auto call = [&](int sock, const std::string& bytes) -> Result<Packet> {
        MC_RETURN_IF_ERROR(sendPacket(sock, bytes, -1, deadline));
        return recvPacket(sock, kMaxShmReplyBytes, deadline);
    };
    auto code = [](const Packet& p) { return decodeShmReply(p.bytes).value().code; };

    auto sock = connectAbstract(desc.shm_socket, deadline);
    ASSERT_TRUE(sock.ok()) << sock.status().toString();
    for (int i = 0; i < 3; ++i) {
        auto reply = call(sock->get(), encodeShmRequest({ShmOp::kPing, 0, kSecret}));
        ASSERT_TRUE(reply.ok()) << reply.status().toString();
        EXPECT_EQ(code(reply.value()), ShmReplyCode::kOk);
        EXPECT_FALSE(reply->fd.valid());
    }
    auto opened = call(sock->get(), encodeShmRequest({ShmOp::kOpenAllocation, alloc->id, kSecret}));
    ASSERT_TRUE(opened.ok()) << opened.status().toString();
    EXPECT_EQ(code(opened.value()), ShmReplyCode::kOk);
    ASSERT_TRUE(opened->fd.valid());
    // The descriptor is the allocation itself: a store through a fresh mapping
    // of it shows up in the owner's memory.
    auto mapping = PeerMapping::map(opened->fd, {alloc->id, alloc->addr, alloc->length});
    ASSERT_TRUE(mapping.ok()) << mapping.status().toString();
    *mapping.value()->translate(alloc->addr + 10, 1) = 'x';
    EXPECT_EQ(reinterpret_cast<char*>(alloc->addr)[10], 'x');
    EXPECT_EQ(mapping.value()->translate(alloc->addr + 4090, 7), nullptr);

    auto junk = call(sock->get(), "junk");
    ASSERT_TRUE(junk.ok());
    EXPECT_EQ(code(junk.value()), ShmReplyCode::kBadRequest);
    EXPECT_EQ(recvPacket(sock->get(), kMaxShmReplyBytes, deadline).status().code(),
              StatusCode::kPeerFailure);  // closed by the owner

    auto other = connectAbstract(desc.shm_socket, deadline);
    ASSERT_TRUE(other.ok());
    auto denied = call(other->get(), encodeShmRequest({ShmOp::kPing, 0, "wrong"}));
    ASSERT_TRUE(denied.ok());
    EXPECT_EQ(code(denied.value()), ShmReplyCode::kDenied);
    EXPECT_EQ(recvPacket(other->get(), kMaxShmReplyBytes, deadline).status().code(),
              StatusCode::kPeerFailure);
}

// ---- dead and stuck peers ------------------------------------------------------------

// A child that publishes an engine with two shared allocations and then
// waits to be killed.
std::unique_ptr<Child> spawnVictim(const std::string& dir) {
    return std::make_unique<Child>([dir] {
        auto store = std::make_shared<FileKVStore>(dir);
        auto e = startEngine(store, "victim");
        CHILD_CHECK(e);
        auto a = e->allocateSharedMemory(1 << 20);
        auto b = e->allocateSharedMemory(1 << 20);
        CHILD_CHECK(a.ok() && b.ok());
        std::memset(*a, 0x3c, 1 << 20);
        CHILD_OK(store->set("victim/b", std::to_string(reinterpret_cast<uint64_t>(*b))));
        CHILD_OK(store->set("victim/a", std::to_string(reinterpret_cast<uint64_t>(*a))));
        (void)store->get("never", Deadline::afterMs(2 * kWaitMs));
        return 0;
    });
}

// A victim (spawnVictim) and an engine that opened its segment once the
// victim published it.
struct VictimSession {
    std::unique_ptr<Child> victim;
    std::shared_ptr<FileKVStore> store;
    std::unique_ptr<TransferEngine> engine;
    SegmentID id = -1;
};

// Call through ASSERT_NO_FATAL_FAILURE: it asserts.
void startVictimSession(const std::string& dir, const std::string& engine_name, VictimSession* s) {
    s->victim = spawnVictim(dir);
    ASSERT_TRUE(s->victim->ok());
    s->store = std::make_shared<FileKVStore>(dir);
    s->engine = startEngine(s->store, engine_name);
    ASSERT_TRUE(s->engine);
    ASSERT_NE(waitAddr(*s->store, "victim/a"), 0u);
    auto id = s->engine->openSegment("victim");
    ASSERT_TRUE(id.ok());
    s->id = id.value();
}

TEST(ShmTransport, ProbeOfKilledPeerFailsQuickly) {
    TempDir dir;
    VictimSession s;
    ASSERT_NO_FATAL_FAILURE(startVictimSession(dir.path(), "prober", &s));
    Status st = s.engine->probePeerAlive(s.id, Deadline::afterMs(5000));
    ASSERT_TRUE(st.ok()) << st.toString();

    s.victim->kill(SIGKILL);
    ASSERT_EQ(s.victim->wait(Deadline::afterMs(kWaitMs)), 128 + SIGKILL);
    auto t0 = std::chrono::steady_clock::now();
    st = s.engine->probePeerAlive(s.id, Deadline::afterMs(5000));
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_FALSE(st.ok());
    // A refused connect needs no waiting; the bound only absorbs a loaded machine.
    EXPECT_LT(took, std::chrono::milliseconds(2000)) << st.toString();
}

TEST(ShmTransport, ProbeOfStoppedPeerFailsAtTheDeadline) {
    TempDir dir;
    VictimSession s;
    ASSERT_NO_FATAL_FAILURE(startVictimSession(dir.path(), "prober", &s));
    ASSERT_TRUE(s.engine->probePeerAlive(s.id, Deadline::afterMs(5000)).ok());

    ASSERT_TRUE(s.victim->stop());
    auto t0 = std::chrono::steady_clock::now();
    Status st = s.engine->probePeerAlive(s.id, Deadline::afterMs(300));
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_FALSE(st.ok());
    EXPECT_GE(took, std::chrono::milliseconds(250));
    EXPECT_LT(took, std::chrono::milliseconds(3000)) << st.toString();
}

TEST(ShmTransport, MappingOfKilledPeerStaysSafe) {
    TempDir dir;
    auto victim = spawnVictim(dir.path());
    ASSERT_TRUE(victim->ok());
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto e = startEngine(store, "survivor");
    ASSERT_TRUE(e);
    Buffer local(1 << 20);
    ASSERT_TRUE(e->registerLocalMemory(local.data, local.size).ok());
    uint64_t a = waitAddr(*store, "victim/a");
    uint64_t b = waitAddr(*store, "victim/b");
    ASSERT_TRUE(a && b);
    auto id = e->openSegment("victim");
    ASSERT_TRUE(id.ok());
    auto p = e->mapRemote(id.value(), a, 1 << 20);
    ASSERT_TRUE(p.ok()) << p.status().toString();
    char* view = static_cast<char*>(p.value());
    ASSERT_TRUE(allBytes(view, 1 << 20, 0x3c));

    victim->kill(SIGKILL);
    ASSERT_EQ(victim->wait(Deadline::afterMs(kWaitMs)), 128 + SIGKILL);

    // The mapping still holds the memfd: loads, stores and transfers through
    // it work on the orphaned pages instead of faulting.
    EXPECT_TRUE(allBytes(view, 1 << 20, 0x3c));
    std::memset(view, 0x7e, 4096);
    fillPattern(local.data, local.size, 3);
    ASSERT_TRUE(transfer(*e, TransferOpcode::kWrite, local.data, id.value(), a + 4096, 8192).ok());
    EXPECT_EQ(std::memcmp(view + 4096, local.data, 8192), 0);
    std::memset(local.data, 0, local.size);
    ASSERT_TRUE(transfer(*e, TransferOpcode::kRead, local.data, id.value(), a, 4096).ok());
    EXPECT_TRUE(allBytes(local.data, 4096, 0x7e));

    // An allocation never mapped before cannot be reached any more: an error,
    // promptly, not a crash.
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(transfer(*e, TransferOpcode::kWrite, local.data, id.value(), b, 4096).ok());
    EXPECT_FALSE(e->mapRemote(id.value(), b, 4096).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
}
}  // namespace
}  // namespace mooncake::te
