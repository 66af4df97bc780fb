// Where RDMA cannot run (every machine here): the engine says why once,
// starts without error, and peers on other hosts are reached over tcp, even
// when they advertise an RDMA endpoint themselves.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"

namespace mooncake::te {
namespace {

EngineOptions options(std::shared_ptr<KVStore> store, const std::string& name) {
    EngineOptions o;
    o.store = std::move(store);
    o.segment_name = name;
    o.secret = "s3cret";
    o.key_prefix = "rdma-fallback";
    o.open_timeout_ms = 5000;
    return o;
}

bool mentions(const Status& st, const std::string& text) {
    return st.message().find(text) != std::string::npos;
}

TEST(RdmaFallback, MissingVerbsLibraryIsReportedNotFatal) {
    RdmaSetup setup = createRdmaTransport(RdmaOptions{{}, "libmc_no_such_verbs.so.1", {}});
    EXPECT_EQ(setup.transport, nullptr);
    EXPECT_TRUE(setup.devices.empty());
    EXPECT_EQ(setup.status.code(), StatusCode::kUnavailable);
#ifdef MC_WITH_RDMA
    EXPECT_TRUE(mentions(setup.status, "the verbs library is missing")) << setup.status.toString();
#else
    EXPECT_TRUE(mentions(setup.status, "WITH_RDMA=OFF")) << setup.status.toString();
#endif

    auto store = std::make_shared<InProcessKVStore>();
    EngineOptions o = options(store, "a");
    o.verbs_library = "libmc_no_such_verbs.so.1";
    TransferEngine engine(o);
    ASSERT_TRUE(engine.init("127.0.0.1", {}).ok());
    EXPECT_EQ(engine.rdmaStatus().code(), StatusCode::kUnavailable);
    EXPECT_TRUE(engine.devices().empty());
    EXPECT_TRUE(engine.preferredHca("cuda:0").value().empty());
    EXPECT_TRUE(engine.preferredHca("cpu").value().empty());
}

// The real library where there is one, on a host without an HCA.
TEST(RdmaFallback, NoDeviceIsReportedNotFatal) {
    RdmaSetup setup = createRdmaTransport(RdmaOptions{});
    if (setup.transport) {
        GTEST_SKIP() << "this host has a usable RDMA device (" << setup.devices.front()
                     << "): the no-device path cannot be shown here";
    }
    EXPECT_EQ(setup.status.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(mentions(setup.status, "no RDMA device") ||
                mentions(setup.status, "the verbs library is missing"))
        << setup.status.toString();
    // A filter naming devices that are not here is not an error either.
    RdmaSetup filtered = createRdmaTransport(RdmaOptions{{"mlx5_1", "mlx5_2:1"}, "", {}});
    EXPECT_EQ(filtered.status.code(), StatusCode::kUnavailable) << filtered.status.toString();
}

// IBGDA's probe on the same hosts: a reason, never an error.
TEST(RdmaFallback, IbgdaProbeGivesTheReasonThereIsNone) {
    IbgdaProbe missing = probeIbgda(RdmaOptions{{}, "libmc_no_such_verbs.so.1", {}});
    EXPECT_EQ(missing.status.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(missing.device.empty());
#ifdef MC_WITH_RDMA
    EXPECT_TRUE(mentions(missing.status, "the verbs library is missing"))
        << missing.status.toString();
#else
    EXPECT_TRUE(mentions(missing.status, "WITH_RDMA=OFF")) << missing.status.toString();
#endif
    IbgdaProbe here = probeIbgda(RdmaOptions{});
    if (here.status.ok())
        GTEST_SKIP() << "this host has an IBGDA-capable device (" << here.device << ")";
    EXPECT_EQ(here.status.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(mentions(here.status, "no RDMA device") ||
                mentions(here.status, "no IBGDA-capable device") ||
                mentions(here.status, "the verbs library is missing") ||
                mentions(here.status, "WITH_RDMA=OFF"))
        << here.status.toString();
    EXPECT_EQ(probeIbgda(RdmaOptions{{"mlx5_0:0"}, "", {}}).status.code(),
              StatusCode::kInvalidArgument);
}

TEST(RdmaFallback, MalformedDeviceFilterFailsInit) {
    auto store = std::make_shared<InProcessKVStore>();
    TransferEngine engine(options(store, "a"));
    Status st = engine.init("127.0.0.1", {"mlx5_0:0"});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(),
              "TransferEngine::init device_filter: device_filter entry 'mlx5_0:0' has port '0'; "
              "expected a port number in 1..255 after ':'");
    // Nothing was left half started: a corrected init works.
    ASSERT_TRUE(engine.init("127.0.0.1", {"mlx5_0:1"}).ok());
    std::vector<char> a(64, 'x'), b(64, 0);
    ASSERT_TRUE(engine.registerLocalMemory(a.data(), a.size()).ok());
    ASSERT_TRUE(engine.registerLocalMemory(b.data(), b.size()).ok());
    auto batch = engine.allocateBatchID(1);
    ASSERT_TRUE(batch.ok());
    TransferRequest req{TransferOpcode::kWrite, a.data(), kLocalSegment,
                        reinterpret_cast<uint64_t>(b.data()), a.size()};
    ASSERT_TRUE(engine.submitTransfer(batch.value(), {req}).ok());
    ASSERT_TRUE(engine.waitBatch(batch.value(), Deadline::afterMs(5000)).ok());
    EXPECT_EQ(b, a);
}

// Peer "far" is engine b's memory published as if from another host with an
// RDMA endpoint: a requests pick tcp and the bytes arrive.
TEST(RdmaFallback, OtherHostPeersUseTcp) {
    auto store = std::make_shared<InProcessKVStore>();
    TransferEngine a(options(store, "a"));
    TransferEngine b(options(store, "b"));
    ASSERT_TRUE(a.init("127.0.0.1", {"mlx5_0"}).ok());
    ASSERT_TRUE(b.init("127.0.0.1", {}).ok());
    EXPECT_FALSE(a.rdmaStatus().ok());

    std::vector<char> src(8192), dst(8192, 0);
    for (size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<char>(i * 7 + 1);
    ASSERT_TRUE(a.registerLocalMemory(src.data(), src.size()).ok());
    ASSERT_TRUE(b.registerLocalMemory(dst.data(), dst.size()).ok());

    auto bytes = store->get("rdma-fallback/segment/b", Deadline::afterMs(1000));
    ASSERT_TRUE(bytes.ok());
    SegmentDesc far = SegmentDesc::parse(bytes.value()).value();
    far.name = "far";
    far.host_id = "another-host/net:[1]";
    far.shm_socket.clear();
    rdma::RdmaEndpoint endpoint;
    endpoint.device = "mlx5_0";
    far.rdma_endpoint = endpoint.serialize();
    for (RegionDesc& r : far.regions)
        r.rdma_export = rdma::RegionKey{r.addr, r.length, 0x1234}.serialize();
    ASSERT_TRUE(store->set("rdma-fallback/segment/far", far.serialize()).ok());

    auto peer = a.openSegment("far");
    ASSERT_TRUE(peer.ok()) << peer.status().toString();
    const uint64_t target = reinterpret_cast<uint64_t>(dst.data());
    EXPECT_EQ(a.transportFor(peer.value(), target, dst.size()).value(), "tcp");
    auto batch = a.allocateBatchID(1);
    ASSERT_TRUE(batch.ok());
    TransferRequest req{TransferOpcode::kWrite, src.data(), peer.value(), target, src.size()};
    ASSERT_TRUE(a.submitTransfer(batch.value(), {req}).ok());
    Status done = a.waitBatch(batch.value(), Deadline::afterMs(10000));
    ASSERT_TRUE(done.ok()) << done.toString();
    EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
    ASSERT_TRUE(a.freeBatchID(batch.value()).ok());
}

TEST(RdmaFallback, PreferredHcaRejectsUnknownLocations) {
    auto store = std::make_shared<InProcessKVStore>();
    TransferEngine engine(options(store, "a"));
    ASSERT_TRUE(engine.init("127.0.0.1", {}).ok());
    auto r = engine.preferredHca("gpu0");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              "location 'gpu0': expected 'cpu', 'cpu:<NUMA node>' or 'cuda:<device>'");
    EXPECT_FALSE(engine.preferredHca("cpu:x").ok());
}

}  // namespace
}  // namespace mooncake::te
