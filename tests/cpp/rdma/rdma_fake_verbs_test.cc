// The rdma transport end to end over fake_verbs.cc (an in-process emulation
// of HCAs and RC queue pairs), since no machine here has a NIC: discovery and
// the device filter, port and GID choice, the store handshake, the QP
// transitions as a strict provider checks them, chunked WRITE/READ with exact
// bytes, more requests than a send queue holds, a stalled peer caught by the
// deadline, a dead peer and a stale rkey turned into FAILED requests. The
// IBGDA pieces over the same fake are in ibgda_fake_verbs_test.cc.
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "tests/cpp/rdma/fake_verbs_test_util.h"
#include "tests/cpp/te/shm_test_util.h"

namespace mooncake::te {
namespace {

using namespace fake_verbs_test;  // NOLINT: kLibrary, fakeDevices, stall

// Read once by the transport: set before anything runs.
const bool kEnvironment = [] {
    ::setenv("MC_RDMA_SAME_HOST", "1", 1);  // both engines live in this process
    ::setenv("MC_RDMA_REQUEST_TIMEOUT_MS", "500", 1);
    ::setenv("MC_RDMA_CONNECT_TIMEOUT_MS", "5000", 1);
    return true;
}();

EngineOptions options(std::shared_ptr<KVStore> store, const char* name) {
    EngineOptions o;
    o.store = std::move(store);
    o.segment_name = name;
    o.secret = "fake";
    o.key_prefix = "fake-rdma";
    o.verbs_library = kLibrary;
    return o;
}

TEST(FakeVerbsDiscovery, FirstActivePortOfTheAdmittedDevices) {
    ASSERT_TRUE(kEnvironment);
    fakeDevices("mlx5_0=down/ib,mlx5_1=active/eth");
    RdmaSetup all = createRdmaTransport(RdmaOptions{{}, kLibrary, {}});
    ASSERT_TRUE(all.status.ok()) << all.status.toString();
    EXPECT_NE(all.transport, nullptr);
    EXPECT_EQ(all.devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));

    RdmaSetup down = createRdmaTransport(RdmaOptions{{"mlx5_0"}, kLibrary, {}});
    EXPECT_EQ(down.transport, nullptr);
    EXPECT_EQ(down.status.message(),
              "no usable RDMA device: UNAVAILABLE: device mlx5_0 has no ACTIVE port");
    RdmaSetup port2 = createRdmaTransport(RdmaOptions{{"mlx5_1:2"}, kLibrary, {}});
    EXPECT_EQ(port2.status.message(),
              "no usable RDMA device: UNAVAILABLE: device mlx5_1 port 2 is not ACTIVE");
    RdmaSetup absent = createRdmaTransport(RdmaOptions{{"mlx5_7"}, kLibrary, {}});
    EXPECT_EQ(absent.status.message(),
              "no RDMA device admitted by the device filter [mlx5_7]; present: [mlx5_0, mlx5_1]");
    fakeDevices("");
    RdmaSetup none = createRdmaTransport(RdmaOptions{{}, kLibrary, {}});
    EXPECT_EQ(none.status.message(), "no RDMA device (ibv_get_device_list lists none)");
}

TEST(FakeVerbsDiscovery, PublishesTheChosenPortAndGid) {
    fakeDevices("mlx5_0=down/ib,mlx5_1=active/eth");
    auto store = std::make_shared<InProcessKVStore>();
    TransferEngine engine(options(store, "a"));
    ASSERT_TRUE(engine.init("127.0.0.1", {}).ok());
    ASSERT_TRUE(engine.rdmaStatus().ok()) << engine.rdmaStatus().toString();
    auto desc = engine.segmentDesc(kLocalSegment);
    ASSERT_TRUE(desc.ok());
    auto ep = rdma::RdmaEndpoint::parse(desc->rdma_endpoint);
    ASSERT_TRUE(ep.ok()) << ep.status().toString();
    EXPECT_EQ(ep->device, "mlx5_1");
    EXPECT_EQ(ep->port, 1);
    EXPECT_EQ(ep->gid_index, 1);  // the IPv4-mapped GID on RoCE
    EXPECT_EQ(ep->gid[10], 0xff);
    EXPECT_EQ(ep->gid[12], 10);
    EXPECT_EQ(ep->link_layer, IBV_LINK_LAYER_ETHERNET);
    EXPECT_EQ(ep->lid, 0);
    EXPECT_EQ(ep->mtu, IBV_MTU_4096);
}

// An HCA that is present but cannot start (here ibv_create_cq fails) costs
// the engine rdma, not its start: init succeeds, says why rdma is off, and
// peers are reached over the other transports.
TEST(FakeVerbsDiscovery, TransportThatFailsToStartIsDroppedNotFatal) {
    fakeDevices("mlx5_0=active/ib");
    ::setenv("MC_FAKE_VERBS_FAIL_CREATE_CQ", "1", 1);
    auto store = std::make_shared<InProcessKVStore>();
    TransferEngine a(options(store, "a")), b(options(store, "b"));
    Status st = a.init("127.0.0.1", {});
    Status st_b = b.init("127.0.0.1", {});
    ::unsetenv("MC_FAKE_VERBS_FAIL_CREATE_CQ");
    ASSERT_TRUE(st.ok()) << st.toString();
    ASSERT_TRUE(st_b.ok()) << st_b.toString();
    EXPECT_EQ(a.rdmaStatus().code(), StatusCode::kUnavailable);
    EXPECT_NE(a.rdmaStatus().message().find("failed to start"), std::string::npos)
        << a.rdmaStatus().toString();
    EXPECT_NE(a.rdmaStatus().message().find("ibv_create_cq"), std::string::npos)
        << a.rdmaStatus().toString();
    EXPECT_TRUE(a.devices().empty());

    std::vector<char> src(4096), dst(4096, 0);
    for (size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<char>(i * 7 + 1);
    ASSERT_TRUE(a.registerLocalMemory(src.data(), src.size()).ok());
    ASSERT_TRUE(b.registerLocalMemory(dst.data(), dst.size()).ok());
    auto peer = a.openSegment("b");
    ASSERT_TRUE(peer.ok()) << peer.status().toString();
    const uint64_t remote = reinterpret_cast<uint64_t>(dst.data());
    // Heap memory, so tcp (shm maps only the engine's shared allocations).
    EXPECT_EQ(a.transportFor(peer.value(), remote, dst.size()).value(), "tcp");
    st =
        shm_test::transfer(a, TransferOpcode::kWrite, src.data(), peer.value(), remote, src.size());
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(src, dst);
}

class FakeVerbsPair : public ::testing::TestWithParam<const char*> {
protected:
    void SetUp() override {
        fakeDevices(GetParam());
        store_ = std::make_shared<InProcessKVStore>();
        a_ = std::make_unique<TransferEngine>(options(store_, "a"));
        b_ = std::make_unique<TransferEngine>(options(store_, "b"));
        ASSERT_TRUE(a_->init("127.0.0.1", {}).ok());
        ASSERT_TRUE(b_->init("127.0.0.1", {}).ok());
        ASSERT_TRUE(a_->rdmaStatus().ok()) << a_->rdmaStatus().toString();
        src_.resize(kBytes);
        dst_.assign(kBytes, 0);
        for (size_t i = 0; i < kBytes; ++i)
            src_[i] = static_cast<char>((i * 131 + 17) % 251);
        ASSERT_TRUE(a_->registerLocalMemory(src_.data(), kBytes).ok());
        ASSERT_TRUE(b_->registerLocalMemory(dst_.data(), kBytes).ok());
        auto peer = a_->openSegment("b");
        ASSERT_TRUE(peer.ok()) << peer.status().toString();
        peer_ = peer.value();
    }
    void TearDown() override { stall(false); }

    Status run(const std::vector<TransferRequest>& reqs) {
        auto batch = a_->allocateBatchID(reqs.size());
        if (!batch.ok())
            return batch.status();
        Status st = a_->submitTransfer(batch.value(), reqs);
        if (st.ok())
            st = a_->waitBatch(batch.value(), Deadline::afterMs(20000));
        (void)a_->freeBatchID(batch.value());
        return st;
    }
    TransferRequest req(TransferOpcode op, uint64_t src_off, uint64_t dst_off, uint64_t len) {
        return TransferRequest{op, src_.data() + src_off, peer_,
                               reinterpret_cast<uint64_t>(dst_.data()) + dst_off, len};
    }

    static constexpr size_t kBytes = 40u << 20;  // three 16 MiB chunks
    std::shared_ptr<InProcessKVStore> store_;
    std::unique_ptr<TransferEngine> a_, b_;
    std::vector<char> src_, dst_;
    SegmentID peer_ = -1;
};

TEST_P(FakeVerbsPair, WriteAndReadInChunks) {
    EXPECT_EQ(a_->transportFor(peer_, reinterpret_cast<uint64_t>(dst_.data()), kBytes).value(),
              "rdma");
    Status st = run({req(TransferOpcode::kWrite, 0, 0, kBytes)});
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(0, std::memcmp(src_.data(), dst_.data(), kBytes));
    // READ back into a cleared source, from an unaligned offset.
    std::vector<char> expected(src_.begin() + 3, src_.begin() + 3 + (kBytes - 7));
    std::memset(src_.data(), 0, kBytes);
    st = run({req(TransferOpcode::kRead, 5, 3, kBytes - 7)});
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(0, std::memcmp(src_.data() + 5, expected.data(), expected.size()));
    EXPECT_EQ(src_[4], 0);
}

TEST_P(FakeVerbsPair, MoreRequestsThanTheSendQueueHolds) {
    std::vector<TransferRequest> reqs;
    for (uint64_t i = 0; i < 600; ++i)
        reqs.push_back(req(TransferOpcode::kWrite, i * 1000, i * 1000 + 1, 999));
    Status st = run(reqs);
    ASSERT_TRUE(st.ok()) << st.toString();
    for (uint64_t i = 0; i < 600; ++i)
        ASSERT_EQ(0, std::memcmp(src_.data() + i * 1000, dst_.data() + i * 1000 + 1, 999)) << i;
}

TEST_P(FakeVerbsPair, StalledPeerFailsAtTheDeadlineThenReconnects) {
    ASSERT_TRUE(run({req(TransferOpcode::kWrite, 0, 0, 4096)}).ok());
    stall(true);
    const auto t0 = Deadline::Clock::now();
    Status st = run({req(TransferOpcode::kWrite, 0, 0, 4096)});
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
    EXPECT_EQ(st.message(), "rdma request to segment b did not complete within 500 ms");
    // The request deadline acted, not the caller's 20 s wait.
    EXPECT_LT(Deadline::Clock::now() - t0, std::chrono::seconds(10));
    stall(false);
    src_[0] = 42;
    st = run({req(TransferOpcode::kWrite, 0, 0, 4096)});
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(dst_[0], 42);
}

TEST_P(FakeVerbsPair, DeadPeerFailsTheRequest) {
    ASSERT_TRUE(run({req(TransferOpcode::kWrite, 0, 0, 4096)}).ok());
    b_->shutdown();
    Status st = run({req(TransferOpcode::kWrite, 0, 0, 4096)});
    EXPECT_EQ(st.code(), StatusCode::kPeerFailure) << st.toString();
    EXPECT_EQ(st.message(),
              "work completion failed: transport retry counter exceeded (12) for segment b");
}

TEST_P(FakeVerbsPair, StaleRkeyFailsAsOutOfRange) {
    // b re-registers its memory: a's cached descriptor still has the old rkey.
    ASSERT_TRUE(b_->unregisterLocalMemory(dst_.data()).ok());
    ASSERT_TRUE(b_->registerLocalMemory(dst_.data(), kBytes).ok());
    Status st = run({req(TransferOpcode::kWrite, 0, 0, 64)});
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.toString();
    EXPECT_EQ(st.message(), "work completion failed: remote access error (10) for segment b");
    // After a refresh the new key works.
    ASSERT_TRUE(a_->refreshSegment(peer_, Deadline::afterMs(1000)).ok());
    st = run({req(TransferOpcode::kWrite, 0, 0, 64)});
    EXPECT_TRUE(st.ok()) << st.toString();
}

INSTANTIATE_TEST_SUITE_P(LinkLayers, FakeVerbsPair,
                         ::testing::Values("mlx5_0=active/ib", "mlx5_0=active/eth"),
                         [](const auto& info) {
                             return std::string(info.index == 0 ? "InfiniBand" : "RoCE");
                         });

}  // namespace
}  // namespace mooncake::te
