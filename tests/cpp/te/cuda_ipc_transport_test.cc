// cuda_ipc: exportable device memory mapped across processes (several on one
// GPU included), byte-exact READ/WRITE from host and device sources, direct
// mapping, the group secret, and the engine refusing CPU transports for
// device memory. Device tests fork before any CUDA call (a CUDA context does
// not survive fork) and skip with the reason where no GPU is usable.
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "tests/cpp/te/cuda_test_util.h"
#include "tests/cpp/te/shm_test_util.h"
#ifdef MC_WITH_CUDA
#include "mooncake-transfer-engine/transport/cuda_ipc/cuda_driver.h"
#endif

namespace mooncake::te {
namespace {

using namespace shm_test;  // NOLINT(build/namespaces): test helpers only

TEST(CudaLocation, ParsesOnlyCanonicalOrdinals) {
    EXPECT_EQ(cudaOrdinal("cuda:0"), 0);
    EXPECT_EQ(cudaOrdinal("cuda:13"), 13);
    EXPECT_EQ(cudaOrdinal("cpu"), -1);
    EXPECT_EQ(cudaOrdinal("cuda:"), -1);
    EXPECT_EQ(cudaOrdinal("cuda:-1"), -1);
    EXPECT_EQ(cudaOrdinal("cuda:1x"), -1);
    EXPECT_EQ(cudaOrdinal("cuda"), -1);
}

// Host memory labelled as device memory stands in for a device region: the
// CPU transports must refuse it whatever its bytes are.
TEST(CudaIpcSelection, CpuTransportsRefuseDeviceMemory) {
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto a = startEngine(store, "a", kSecret, /*force_tcp=*/true);
    auto b = startEngine(store, "b", kSecret, /*force_tcp=*/true);
    ASSERT_TRUE(a && b);
    Buffer on_device(1 << 16), host(1 << 16), local_device(1 << 16);
    ASSERT_TRUE(b->registerLocalMemory(on_device.data, on_device.size, "cuda:0").ok());
    ASSERT_TRUE(b->registerLocalMemory(host.data, host.size, "cpu").ok());
    ASSERT_TRUE(a->registerLocalMemory(local_device.data, local_device.size, "cuda:0").ok());
    auto id = a->openSegment("b");
    ASSERT_TRUE(id.ok()) << id.status().toString();

    auto t = a->transportFor(id.value(), reinterpret_cast<uint64_t>(on_device.data), 64);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().toString();
    t = a->transportFor(id.value(), reinterpret_cast<uint64_t>(host.data), 64);
    ASSERT_TRUE(t.ok()) << t.status().toString();
    EXPECT_EQ(t.value(), "tcp");

    std::memset(host.data, 0x5a, 64);
    Status st = transfer(*a, TransferOpcode::kWrite, local_device.data, id.value(),
                         reinterpret_cast<uint64_t>(host.data), 64);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kUnavailable);
    EXPECT_NE(st.toString().find("device memory (cuda:0)"), std::string::npos) << st.toString();
    EXPECT_TRUE(allBytes(host.data, 64, 0x5a)) << "a refused request wrote bytes";
}

TEST(CudaIpcSelection, DeviceAllocationWithoutCudaSaysWhy) {
    if (deviceMemoryAvailable().ok())
        GTEST_SKIP() << "a CUDA device is usable here";
    TempDir dir;
    auto store = std::make_shared<FileKVStore>(dir.path());
    auto a = startEngine(store, "a");
    ASSERT_TRUE(a);
    auto p = a->allocateDeviceMemory(1 << 20, 0);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kUnavailable) << p.status().toString();
}

#ifdef MC_WITH_CUDA

// Host <-> device through the driver, for setting up and checking device bytes.
Status deviceCopy(void* dst, const void* src, size_t len) {
    MC_ASSIGN_OR_RETURN(const CudaDriver* cu, CudaDriver::get());
    MC_RETURN_IF_ERROR(useDevice(*cu, 0));
    MC_RETURN_IF_ERROR(cu->check(cu->memcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                 reinterpret_cast<CUdeviceptr>(src), len, nullptr),
                                 "test copy"));
    return cu->check(cu->streamSynchronize(nullptr), "test sync");
}

constexpr size_t kLen = (4 << 20) + 123;  // rounded up by the allocator
constexpr uint64_t kWriteOff = 4097;
constexpr size_t kWriteLen = (1 << 20) + 3;
constexpr uint64_t kDeviceWriteOff = 3 << 20;
constexpr size_t kDeviceWriteLen = 65536 + 7;

// The owner: device memory filled with pattern 1, checked after the peers
// are done: pattern 2 at kWriteOff, pattern 3 at kDeviceWriteOff, 1 elsewhere.
int ownerBody(const std::string& dir) {
    auto store = std::make_shared<FileKVStore>(dir);
    auto a = startEngine(store, "a");
    CHILD_CHECK(a);
    auto p = a->allocateDeviceMemory(kLen, 0);
    CHILD_OK(p.status());
    std::vector<char> expect(kLen);
    fillPattern(expect.data(), kLen, 1);
    CHILD_OK(deviceCopy(p.value(), expect.data(), kLen));
    CHILD_OK(store->set("a/addr", std::to_string(reinterpret_cast<uint64_t>(p.value()))));
    CHILD_CHECK(!waitKey(*store, "peer/done").empty());

    fillPattern(expect.data() + kWriteOff, kWriteLen, 2);
    fillPattern(expect.data() + kDeviceWriteOff, kDeviceWriteLen, 3);
    std::vector<char> got(kLen);
    CHILD_OK(deviceCopy(got.data(), p.value(), kLen));
    for (size_t i = 0; i < kLen; ++i) {
        if (got[i] != expect[i]) {
            std::fprintf(stderr, "owner: byte %zu is %d, expected %d\n", i, got[i], expect[i]);
            return 1;
        }
    }
    CHILD_OK(a->freeSharedMemory(p.value()));
    return 0;
}

// A peer on the same GPU: reads, writes from host and from its own device
// memory, maps the owner's memory, and is refused out of bounds.
int peerBody(const std::string& dir) {
    auto store = std::make_shared<FileKVStore>(dir);
    auto b = startEngine(store, "b");
    CHILD_CHECK(b);
    uint64_t remote = waitAddr(*store, "a/addr");
    CHILD_CHECK(remote != 0);
    auto id = b->openSegment("a");
    CHILD_OK(id.status());
    auto t = b->transportFor(id.value(), remote + 17, 4096);
    CHILD_OK(t.status());
    CHILD_CHECK(t.value() == "cuda_ipc");

    std::vector<char> pattern1(kLen);
    fillPattern(pattern1.data(), kLen, 1);
    Buffer host(kLen);
    CHILD_OK(b->registerLocalMemory(host.data, host.size));
    CHILD_OK(transfer(*b, TransferOpcode::kRead, host.data, id.value(), remote, kLen));
    CHILD_CHECK(std::memcmp(host.data, pattern1.data(), kLen) == 0);

    fillPattern(host.data, kWriteLen, 2);
    CHILD_OK(
        transfer(*b, TransferOpcode::kWrite, host.data, id.value(), remote + kWriteOff, kWriteLen));

    auto mine = b->allocateDeviceMemory(kDeviceWriteLen, 0);
    CHILD_OK(mine.status());
    std::vector<char> pattern3(kDeviceWriteLen);
    fillPattern(pattern3.data(), kDeviceWriteLen, 3);
    CHILD_OK(deviceCopy(mine.value(), pattern3.data(), kDeviceWriteLen));
    CHILD_OK(transfer(*b, TransferOpcode::kWrite, mine.value(), id.value(),
                      remote + kDeviceWriteOff, kDeviceWriteLen));

    auto mapped = b->mapRemote(id.value(), remote + kWriteOff, kWriteLen);
    CHILD_OK(mapped.status());
    std::vector<char> through_map(kWriteLen);
    CHILD_OK(deviceCopy(through_map.data(), mapped.value(), kWriteLen));
    CHILD_CHECK(std::memcmp(through_map.data(), host.data, kWriteLen) == 0);

    auto desc = b->segmentDesc(id.value());
    CHILD_OK(desc.status());
    const RegionDesc* region = desc->findRegion(remote, 1);
    CHILD_CHECK(region != nullptr);
    Status oob = transfer(*b, TransferOpcode::kWrite, host.data, id.value(),
                          region->addr + region->length - 10, 20);
    CHILD_CHECK(oob.code() == StatusCode::kOutOfRange);

    // A process without the group secret cannot map the memory.
    auto outsider = startEngine(store, "outsider", "not-the-secret");
    CHILD_CHECK(outsider);
    Buffer scratch(4096);
    CHILD_OK(outsider->registerLocalMemory(scratch.data, scratch.size));
    auto oid = outsider->openSegment("a");
    CHILD_OK(oid.status());
    Status denied =
        transfer(*outsider, TransferOpcode::kWrite, scratch.data, oid.value(), remote, 4096);
    CHILD_CHECK(!denied.ok());
    CHILD_CHECK(denied.code() == StatusCode::kPermissionDenied);
    CHILD_OK(store->set("peer/done", "1"));
    return 0;
}

TEST(CudaIpcTransport, TwoProcessesOneGpuByteExact) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    Child owner([&] { return ownerBody(dir.path()); });
    Child peer([&] { return peerBody(dir.path()); });
    ASSERT_TRUE(owner.ok() && peer.ok());
    EXPECT_EQ(peer.wait(Deadline::afterMs(4 * kWaitMs)), 0);
    EXPECT_EQ(owner.wait(Deadline::afterMs(4 * kWaitMs)), 0);
}

#endif  // MC_WITH_CUDA

}  // namespace
}  // namespace mooncake::te
