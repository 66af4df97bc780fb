// The rdma transport end to end over fake_verbs.cc (an in-process emulation
// of HCAs and RC queue pairs), since no machine here has a NIC: discovery and
// the device filter, port and GID choice, the store handshake, the QP
// transitions as a strict provider checks them, chunked WRITE/READ with exact
// bytes, more requests than a send queue holds, a stalled peer caught by the
// deadline, a dead peer and a stale rkey turned into FAILED requests.
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "tests/cpp/te/shm_test_util.h"
#ifdef MC_IBGDA_DEVICE_TESTS
#include <cuda_runtime.h>

#include "mooncake-ep/ibgda/device_queues.h"
#include "mooncake-ep/ibgda/endpoint.h"
#include "mooncake-ep/ibgda/link.h"
#include "tests/cpp/ep/ibgda_links.h"
#include "tests/cpp/ep/ibgda_two_ranks.h"
#include "tests/cpp/rdma/ibgda_queue_device.h"
#endif

namespace mooncake::te {
namespace {

// Read once by the transport: set before anything runs.
const bool kEnvironment = [] {
    ::setenv("MC_RDMA_SAME_HOST", "1", 1);  // both engines live in this process
    ::setenv("MC_RDMA_REQUEST_TIMEOUT_MS", "500", 1);
    ::setenv("MC_RDMA_CONNECT_TIMEOUT_MS", "5000", 1);
    return true;
}();

constexpr const char* kLibrary = MC_FAKE_VERBS_PATH;

void fakeDevices(const char* spec) {
    ::setenv("MC_FAKE_VERBS_DEVICES", spec, 1);
}

void stall(bool on) {
    void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib, nullptr);
    auto fn = reinterpret_cast<void (*)(int)>(::dlsym(lib, "mc_fake_verbs_stall"));
    ASSERT_NE(fn, nullptr);
    fn(on ? 1 : 0);
}

EngineOptions options(std::shared_ptr<KVStore> store, const char* name) {
    EngineOptions o;
    o.store = std::move(store);
    o.segment_name = name;
    o.secret = "fake";
    o.key_prefix = "fake-rdma";
    o.verbs_library = kLibrary;
    return o;
}

// IBGDA needs an mlx5 device with an ACTIVE port; the fake library answers
// for libmlx5 too (mlx5dv_is_supported: devices named mlx5_*).
IbgdaProbe probe(std::vector<std::string> filter = {}, std::string mlx5 = kLibrary) {
    RdmaOptions o;
    o.device_filter = std::move(filter);
    o.verbs_library = kLibrary;
    o.mlx5_library = std::move(mlx5);
    return probeIbgda(o);
}

TEST(FakeVerbsIbgdaProbe, FindsTheFirstActiveMlx5Device) {
    fakeDevices("bnxt_re0=active/eth,mlx5_0=down/ib,mlx5_1=active/eth");
    IbgdaProbe p = probe();
    EXPECT_TRUE(p.status.ok()) << p.status.toString();
    EXPECT_EQ("mlx5_1", p.device);
}

TEST(FakeVerbsIbgdaProbe, SaysWhyNoDeviceQualifies) {
    fakeDevices("bnxt_re0=active/eth,mlx5_0=down/ib");
    IbgdaProbe p = probe();
    EXPECT_EQ(StatusCode::kUnavailable, p.status.code());
    const std::string why = p.status.message();
    EXPECT_EQ(0u, why.rfind("no IBGDA-capable device: ", 0)) << why;
    EXPECT_NE(std::string::npos, why.find("bnxt_re0 is not an mlx5 (ConnectX) device")) << why;
    EXPECT_NE(std::string::npos, why.find("mlx5_0")) << why;
    EXPECT_NE(std::string::npos, why.find("ACTIVE")) << why;
    EXPECT_TRUE(p.device.empty());
}

TEST(FakeVerbsIbgdaProbe, HonoursTheDeviceFilter) {
    fakeDevices("mlx5_0=active/ib,mlx5_1=active/eth");
    EXPECT_EQ("mlx5_1", probe({"mlx5_1"}).device);
    IbgdaProbe none = probe({"mlx5_9"});
    EXPECT_EQ(0u, none.status.message().rfind("no RDMA device", 0)) << none.status.toString();
    EXPECT_EQ(StatusCode::kInvalidArgument, probe({"mlx5_0:0"}).status.code());
}

TEST(FakeVerbsIbgdaProbe, MissingMlx5LibraryIsAReasonNotAnError) {
    fakeDevices("mlx5_0=active/ib");
    IbgdaProbe p = probe({}, "/nonexistent/libmlx5.so.1");
    EXPECT_EQ(StatusCode::kUnavailable, p.status.code());
    EXPECT_NE(std::string::npos,
              p.status.message().find("the mlx5 direct-verbs library is missing"))
        << p.status.toString();
}

// IBGDA queue pairs over the fake provider: created through verbs, located
// through mlx5dv_init_obj, driven with mlx5_queues.h, executed by the
// software HCA behind the fake (mc_fake_verbs_process_direct).
class FakeVerbsIbgda : public ::testing::Test {
protected:
    void SetUp() override {
        fakeDevices("mlx5_0=active/ib");
        static const rdma::VerbsApi* api = [] {
            auto loaded = rdma::VerbsApi::load(kLibrary);
            return loaded.ok() ? new rdma::VerbsApi(loaded.value()) : nullptr;
        }();
        ASSERT_NE(api, nullptr);
        auto dev = rdma::RdmaDevice::open(*api, rdma::DeviceFilterEntry{"mlx5_0", 0});
        ASSERT_TRUE(dev.ok()) << dev.status().toString();
        device = std::move(dev).value();
        auto dv = rdma::Mlx5DirectApi::load(kLibrary);
        ASSERT_TRUE(dv.ok()) << dv.status().toString();
        direct = dv.value();
        void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_NOLOAD);
        ASSERT_NE(lib, nullptr);
        process = reinterpret_cast<size_t (*)()>(::dlsym(lib, "mc_fake_verbs_process_direct"));
        ASSERT_NE(process, nullptr);
    }

    std::unique_ptr<rdma::IbgdaQueuePair> queuePair(uint32_t wqes) {
        auto qp = rdma::IbgdaQueuePair::create(*device, direct, wqes);
        EXPECT_TRUE(qp.ok()) << qp.status().toString();
        return qp.ok() ? std::move(qp).value() : nullptr;
    }

    Status connect(rdma::IbgdaQueuePair& from, const rdma::IbgdaQueuePair& to) {
        return from.connect(rdma::qpLocalFor(*device), rdma::qpAddressOf(*device, to.qpn()));
    }

    std::unique_ptr<rdma::RdmaDevice> device;
    rdma::Mlx5DirectApi direct;
    size_t (*process)() = nullptr;
};

TEST_F(FakeVerbsIbgda, PutsWithCountsReachThePeerThroughTheProvidersQueues) {
    auto a = queuePair(16);
    auto b = queuePair(16);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(connect(*a, *b).ok());
    ASSERT_TRUE(connect(*b, *a).ok());
    EXPECT_EQ(16u, a->sendQueue().wqe_count);
    EXPECT_EQ(a->qpn(), a->sendQueue().qpn);
    constexpr int kPuts = 200;
    constexpr uint32_t kBytes = 96;
    std::vector<unsigned char> src(kPuts * kBytes), dst(kPuts * kBytes, 0);
    for (size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<unsigned char>(i * 13 + 5);
    alignas(8) uint64_t counter = 0;
    std::vector<uint64_t> old(kPuts, ~0ull);
    auto src_mr = device->registerHost(src.data(), src.size());
    auto dst_mr = device->registerHost(dst.data(), dst.size());
    auto counter_mr = device->registerHost(&counter, sizeof(counter));
    auto old_mr = device->registerHost(old.data(), old.size() * sizeof(uint64_t));
    ASSERT_TRUE(src_mr.ok() && dst_mr.ok() && counter_mr.ok() && old_mr.ok());
    rdma::mlx5::SendQueue sq = a->sendQueue();
    rdma::mlx5::CompletionQueue cq = a->completionQueue();
    rdma::mlx5::Completion error;
    for (int i = 0; i < kPuts; ++i) {
        rdma::mlx5::PutWithCount p;
        p.local_addr = reinterpret_cast<uint64_t>(src.data() + i * kBytes);
        p.lkey = src_mr.value()->lkey;
        p.remote_addr = reinterpret_cast<uint64_t>(dst.data() + i * kBytes);
        p.rkey = dst_mr.value()->rkey;
        p.length = kBytes;
        p.counter_addr = reinterpret_cast<uint64_t>(&counter);
        p.counter_rkey = counter_mr.value()->rkey;
        p.add = 1;
        p.old_value_addr = reinterpret_cast<uint64_t>(&old[i]);
        p.old_value_lkey = old_mr.value()->lkey;
        while (!rdma::mlx5::postPutWithCount(sq, p)) {
            ASSERT_GT(process(), 0u) << "a full queue with nothing to execute at put " << i;
            ASSERT_TRUE(rdma::mlx5::reapCompletions(cq, sq, &error)) << int(error.syndrome);
        }
    }
    process();
    ASSERT_TRUE(rdma::mlx5::reapCompletions(cq, sq, &error)) << int(error.syndrome);
    EXPECT_EQ(sq.producer, sq.consumer);
    EXPECT_EQ(src, dst);
    EXPECT_EQ(uint64_t{kPuts}, rdma::mlx5::counterValue(&counter));
    for (int i = 0; i < kPuts; ++i)
        ASSERT_EQ(static_cast<uint64_t>(i), old[i]) << i;
    for (auto* mr : {src_mr.value(), dst_mr.value(), counter_mr.value(), old_mr.value()})
        device->deregister(mr);
}

// The peer's QP is gone: the put fails with retries exceeded (what a dead
// peer looks like to an RC QP), and a stale rkey as a remote access error.
TEST_F(FakeVerbsIbgda, DeadPeerAndStaleKeyComeBackAsErrorCompletions) {
    auto a = queuePair(8);
    auto b = queuePair(8);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(connect(*a, *b).ok());
    ASSERT_TRUE(connect(*b, *a).ok());
    alignas(8) uint64_t counter = 0, old = 0;
    auto counter_mr = device->registerHost(&counter, sizeof(counter));
    auto old_mr = device->registerHost(&old, sizeof(old));
    ASSERT_TRUE(counter_mr.ok() && old_mr.ok());
    rdma::mlx5::PutWithCount p;
    p.counter_addr = reinterpret_cast<uint64_t>(&counter);
    p.counter_rkey = counter_mr.value()->rkey ^ 0x5a5a;
    p.add = 1;
    p.old_value_addr = reinterpret_cast<uint64_t>(&old);
    p.old_value_lkey = old_mr.value()->lkey;
    rdma::mlx5::SendQueue sq = a->sendQueue();
    rdma::mlx5::CompletionQueue cq = a->completionQueue();
    ASSERT_TRUE(rdma::mlx5::postPutWithCount(sq, p));
    process();
    rdma::mlx5::Completion error;
    EXPECT_FALSE(rdma::mlx5::reapCompletions(cq, sq, &error));
    EXPECT_EQ(rdma::mlx5::kSyndromeRemoteAccess, error.syndrome);
    EXPECT_EQ(0u, counter);

    auto c = queuePair(8);
    auto d = queuePair(8);
    ASSERT_TRUE(c && d);
    ASSERT_TRUE(connect(*c, *d).ok());
    ASSERT_TRUE(connect(*d, *c).ok());
    d.reset();  // the peer dies
    p.counter_rkey = counter_mr.value()->rkey;
    rdma::mlx5::SendQueue sq2 = c->sendQueue();
    rdma::mlx5::CompletionQueue cq2 = c->completionQueue();
    ASSERT_TRUE(rdma::mlx5::postPutWithCount(sq2, p));
    process();
    EXPECT_FALSE(rdma::mlx5::reapCompletions(cq2, sq2, &error));
    EXPECT_EQ(rdma::mlx5::kSyndromeRetryExceeded, error.syndrome);
    EXPECT_EQ(0u, counter);
    device->deregister(counter_mr.value());
    device->deregister(old_mr.value());
}

#ifdef MC_IBGDA_DEVICE_TESTS
// A kernel drives the provider's queues mapped into the GPU (EP's
// IbgdaDeviceQueues); the software HCA behind the fake executes what it
// posts, as a NIC would read the same memory. Skips without a GPU.
TEST_F(FakeVerbsIbgda, KernelPostsThroughTheProvidersQueuesMappedIntoTheGpu) {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        (void)cudaGetLastError();
        GTEST_SKIP() << "no usable CUDA device";
    }
    auto a = queuePair(32);
    auto b = queuePair(32);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(connect(*a, *b).ok());
    ASSERT_TRUE(connect(*b, *a).ok());
    auto mapped = ep::IbgdaDeviceQueues::map(*a);
    ASSERT_TRUE(mapped.ok()) << mapped.status().toString();
    constexpr int kPuts = 1000;
    constexpr uint32_t kBytes = 512;
    auto pinned = [](size_t bytes) {
        void* p = nullptr;
        EXPECT_EQ(cudaSuccess, cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
        std::memset(p, 0, bytes);
        return static_cast<unsigned char*>(p);
    };
    unsigned char* src = pinned(size_t{kPuts} * kBytes);
    unsigned char* dst = pinned(size_t{kPuts} * kBytes);
    auto* words = reinterpret_cast<uint64_t*>(pinned((1 + kPuts) * sizeof(uint64_t)));
    auto* puts =
        reinterpret_cast<rdma::mlx5::PutWithCount*>(pinned(kPuts * sizeof(rdma::mlx5::PutWithCount)));
    for (size_t i = 0; i < size_t{kPuts} * kBytes; ++i)
        src[i] = static_cast<unsigned char>(i * 11 + 1);
    auto src_mr = device->registerHost(src, size_t{kPuts} * kBytes);
    auto dst_mr = device->registerHost(dst, size_t{kPuts} * kBytes);
    auto words_mr = device->registerHost(words, (1 + kPuts) * sizeof(uint64_t));
    ASSERT_TRUE(src_mr.ok() && dst_mr.ok() && words_mr.ok());
    for (int i = 0; i < kPuts; ++i) {
        rdma::mlx5::PutWithCount& p = puts[i];
        p.local_addr = reinterpret_cast<uint64_t>(src + size_t{kBytes} * i);
        p.lkey = src_mr.value()->lkey;
        p.remote_addr = reinterpret_cast<uint64_t>(dst + size_t{kBytes} * i);
        p.rkey = dst_mr.value()->rkey;
        p.length = kBytes;
        p.counter_addr = reinterpret_cast<uint64_t>(&words[0]);
        p.counter_rkey = words_mr.value()->rkey;
        p.add = 1;
        p.old_value_addr = reinterpret_cast<uint64_t>(&words[1 + i]);
        p.old_value_lkey = words_mr.value()->lkey;
    }
    const std::string why = rdma::postPutsOnDevice(mapped.value()->sendQueue(),
                                                   mapped.value()->completionQueue(), puts, kPuts,
                                                   [&] { process(); });
    EXPECT_EQ("", why);
    EXPECT_EQ(0, std::memcmp(src, dst, size_t{kPuts} * kBytes));
    EXPECT_EQ(uint64_t{kPuts}, words[0]);
    for (int i = 0; i < kPuts; ++i)
        ASSERT_EQ(static_cast<uint64_t>(i), words[1 + i]) << i;
    for (auto* mr : {src_mr.value(), dst_mr.value(), words_mr.value()})
        device->deregister(mr);
    mapped.value().reset();  // unmapped before the queue pair goes
    for (void* p : {static_cast<void*>(src), static_cast<void*>(dst), static_cast<void*>(words),
                    static_cast<void*>(puts)})
        cudaFreeHost(p);
}
#endif

#ifdef MC_IBGDA_DEVICE_TESTS
// EP's IBGDA endpoint: two ranks in this process exchange the seed's words
// (regions and GIDs gathered, QPs all-to-all), connect, and rank 0 writes
// into rank 1's buffer over each QP it made for rank 1, with the address and
// key rank 1 sent. Needs no GPU (host buffers).
TEST_F(FakeVerbsIbgda, EndpointsExchangeTheSeedsWordsAndReachEachOthersBuffers) {
    constexpr int kQps = 3;
    constexpr size_t kBytes = 1 << 16;
    std::vector<std::vector<uint64_t>> buffers(2, std::vector<uint64_t>(kBytes / 8, 0));
    std::vector<std::unique_ptr<ep::IbgdaEndpoint>> ends;
    for (int r = 0; r < 2; ++r) {
        ep::IbgdaEndpointOptions o;
        o.rank = r;
        o.num_ranks = 2;
        o.qps_per_rank = kQps;
        o.wqes_per_qp = 16;
        o.buffer = buffers[r].data();
        o.bytes = kBytes;
        o.buffer_on_device = false;
        o.verbs_library = kLibrary;
        o.mlx5_library = kLibrary;
        auto e = ep::IbgdaEndpoint::create(o);
        ASSERT_TRUE(e.ok()) << e.status().toString();
        EXPECT_EQ("mlx5_0", e.value()->deviceName());
        ends.push_back(std::move(e).value());
    }
    std::vector<ep::IbgdaEndpoint::Words2> regions, gids;
    for (auto& e : ends) {
        regions.push_back(e->regionWords());
        gids.push_back(e->gidWords());
    }
    // all_to_all: rank r receives from p what p made for r.
    for (int r = 0; r < 2; ++r) {
        std::vector<std::vector<int64_t>> from(2);
        for (int p = 0; p < 2; ++p)
            from[p] = ends[p]->qpWordsFor(r);
        EXPECT_TRUE(from[r].empty());
        ASSERT_TRUE(ends[r]->connect(regions, from, gids).ok());
    }
    EXPECT_EQ(reinterpret_cast<uint64_t>(buffers[1].data()), ends[0]->remoteAddress(1));
    // Rank 0's words 0..255 hold data; each QP q writes 256 bytes of it into
    // rank 1's buffer at 4096 * (q + 1) and counts into rank 1's word 0.
    for (size_t i = 0; i < 256 / 8; ++i)
        buffers[0][i] = 0x0101010101010101ull * (i + 1);
    for (int q = 0; q < kQps; ++q) {
        rdma::mlx5::SendQueue sq = ends[0]->queuePair(1, q).sendQueue();
        rdma::mlx5::CompletionQueue cq = ends[0]->queuePair(1, q).completionQueue();
        rdma::mlx5::PutWithCount p;
        p.local_addr = reinterpret_cast<uint64_t>(buffers[0].data());
        p.lkey = ends[0]->localKey();
        p.remote_addr = ends[0]->remoteAddress(1) + 4096 * (q + 1);
        p.rkey = ends[0]->remoteKey(1);
        p.length = 256;
        p.counter_addr = ends[0]->remoteAddress(1);
        p.counter_rkey = ends[0]->remoteKey(1);
        p.add = 1;
        p.old_value_addr = reinterpret_cast<uint64_t>(&buffers[0][1000 + q]);
        p.old_value_lkey = ends[0]->localKey();
        ASSERT_TRUE(rdma::mlx5::postPutWithCount(sq, p));
        process();
        rdma::mlx5::Completion error;
        ASSERT_TRUE(rdma::mlx5::reapCompletions(cq, sq, &error)) << int(error.syndrome);
        EXPECT_EQ(sq.producer, sq.consumer);
        EXPECT_EQ(0, std::memcmp(buffers[0].data(), &buffers[1][(4096 * (q + 1)) / 8], 256)) << q;
    }
    EXPECT_EQ(uint64_t{kQps}, buffers[1][0]);
    // Words that do not fit are refused, naming the rank.
    std::vector<std::vector<int64_t>> short_list = {{}, {1}};
    const Status bad = ends[0]->connect(regions, short_list, gids);
    EXPECT_EQ(StatusCode::kInvalidArgument, bad.code());
    EXPECT_NE(std::string::npos, bad.message().find("rank 1 sent 1 QPs")) << bad.toString();
}
#endif

#ifdef MC_IBGDA_DEVICE_TESTS
// The whole IBGDA stack of a Buffer short of a NIC: two IbgdaLinks (staging,
// endpoint, QPs of the fake provider), seed 000's words exchanged as the
// group would, connect(), activate() (queues mapped into the GPU, tables
// uploaded), then rounds of dispatch + combine whose cross-rank bytes the
// provider's software HCA moves. Skips without a GPU.
TEST_F(FakeVerbsIbgda, LinksCarryDispatchAndCombineBetweenTwoRanks) {
    SKIP_WITHOUT_GPU();
    const ep::test::Shape s{2, 8, 16, 256, 3};
    std::vector<std::unique_ptr<ep::test::IbgdaTestRank>> ranks;
    std::vector<std::unique_ptr<ep::IbgdaLink>> links;
    for (int r = 0; r < 2; ++r) {
        ranks.push_back(std::make_unique<ep::test::IbgdaTestRank>(s, r));
        ASSERT_TRUE(ranks.back()->ok);
        ep::IbgdaEndpointOptions o;
        o.rank = r;
        o.num_ranks = 2;
        o.qps_per_rank = 2;
        o.wqes_per_qp = 64;
        o.buffer = ranks[r]->buffer;
        o.bytes = static_cast<size_t>(ep::test::ibgdaTestBufferBytes(s));
        o.buffer_on_device = false;  // pinned host memory the software HCA can reach
        o.verbs_library = kLibrary;
        o.mlx5_library = kLibrary;
        auto link = ep::IbgdaLink::create(o);
        ASSERT_TRUE(link.ok()) << link.status().toString();
        links.push_back(std::move(link).value());
    }
    EXPECT_EQ(StatusCode::kInvalidArgument, links[0]->activate().code())
        << "activate() before connect() is refused";
    const Status connected = ep::test::connectLinksInProcess({links[0].get(), links[1].get()});
    ASSERT_TRUE(connected.ok()) << connected.toString();
    std::atomic<bool> done{false};
    std::thread nic([&] {
        while (!done.load())
            process();
    });
    ep::test::runIbgdaRounds(s, {ranks[0].get(), ranks[1].get()},
                             {links[0]->device(), links[1]->device()}, 3);
    done = true;
    nic.join();
}
#endif

TEST_F(FakeVerbsIbgda, RefusesASendQueueSizeTheKernelsCannotIndex) {
    auto odd = rdma::IbgdaQueuePair::create(*device, direct, 12);
    EXPECT_EQ(StatusCode::kInvalidArgument, odd.status().code());
    EXPECT_NE(std::string::npos, odd.status().message().find("power of two")) << odd.status().toString();
    auto huge = rdma::IbgdaQueuePair::create(*device, direct, 1u << 16);
    EXPECT_EQ(StatusCode::kInvalidArgument, huge.status().code());
}

TEST_F(FakeVerbsIbgda, RangesCoverTheQueuesAndMarkTheDoorbellAsIo) {
    auto a = queuePair(32);
    ASSERT_TRUE(a);
    const auto ranges = a->ranges();
    ASSERT_EQ(5u, ranges.size());
    EXPECT_EQ(a->sendQueue().wqes, ranges[0].addr);
    EXPECT_EQ(32u * 64, ranges[0].bytes);
    EXPECT_EQ(32u * 64, ranges[2].bytes);
    int io = 0;
    for (const auto& r : ranges)
        io += r.io ? 1 : 0;
    EXPECT_EQ(1, io);
    EXPECT_TRUE(ranges[4].io);
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
