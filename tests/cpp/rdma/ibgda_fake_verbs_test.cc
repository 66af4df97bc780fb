// EP's IBGDA pieces over the fake verbs library (fake_verbs.cc answers for
// libmlx5 too: mlx5dv_is_supported, and mlx5dv_init_obj handing out queues
// its software HCA executes): the IBGDA probe, queue pairs a thread or a
// kernel drives, the endpoint's seed-000 exchange, and the Buffer's
// IbgdaLink carrying dispatch and combine. The GPU tests skip with the
// reason where no GPU is usable. Part of rdma_fake_tests.
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "tests/cpp/rdma/fake_verbs_test_util.h"
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

using namespace fake_verbs_test;  // NOLINT: kLibrary, fakeDevices

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
    auto* puts = reinterpret_cast<rdma::mlx5::PutWithCount*>(
        pinned(kPuts * sizeof(rdma::mlx5::PutWithCount)));
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
    const std::string why =
        rdma::postPutsOnDevice(mapped.value()->sendQueue(), mapped.value()->completionQueue(), puts,
                               kPuts, [&] { process(); });
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
        // The device it probes is the device it keeps: opened once.
        const int opened_before = fake_verbs_test::devicesOpened();
        auto e = ep::IbgdaEndpoint::create(o);
        ASSERT_TRUE(e.ok()) << e.status().toString();
        EXPECT_EQ("mlx5_0", e.value()->deviceName());
        EXPECT_EQ(fake_verbs_test::devicesOpened(), opened_before + 1);
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
    EXPECT_NE(std::string::npos, odd.status().message().find("power of two"))
        << odd.status().toString();
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

}  // namespace
}  // namespace mooncake::te
