// Forked ranks on the one GPU with a device group between them: each rank's
// window is exportable device memory (transfer engine cuda_ipc), mapped by
// every other rank; the abort word, the current epoch and the result live in
// host-mapped memory. Children report through their exit code; the parent
// never touches CUDA (a context does not survive fork). GoogleTest-free, so
// the device benchmark sets its ranks up the same way (run_ranks.h has the
// tests' driver).
#pragma once

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mooncake-pg/device/device_group.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-pg/device/peer_buffers.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "tests/cpp/pg_device/reduce_reference.h"
#include "tests/cpp/te/cuda_test_util.h"
#include "tests/cpp/te/shm_test_util.h"

namespace mooncake::pg::device::test {

using te::shm_test::kWaitMs;
using te::test::Child;
using te::test::TempDir;

#define CUDA_CHILD_OK(expr)                                                             \
    do {                                                                                \
        cudaError_t _e = (expr);                                                        \
        if (_e != cudaSuccess) {                                                        \
            std::fprintf(stderr, "child at %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                         cudaGetErrorString(_e));                                       \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

// check(d_in, d_out, op) for every op that dtype supports, over two device
// buffers of `elements` T each; stops at the first nonzero return.
template <typename T, typename Check>
int forEachSupportedOp(DataType dtype, size_t elements, Check&& check) {
    T* d_in = nullptr;
    T* d_out = nullptr;
    CUDA_CHILD_OK(cudaMalloc(&d_in, elements * sizeof(T)));
    CUDA_CHILD_OK(cudaMalloc(&d_out, elements * sizeof(T)));
    int rc = 0;
    for (ReduceOp op : kAllOps) {
        if (rc == 0 && reduceOpSupported(op, dtype, nullptr))
            rc = check(d_in, d_out, op);
    }
    cudaFree(d_in);
    cudaFree(d_out);
    return rc;
}

// Everything one rank holds.
struct Rank {
    int rank = 0;
    int size = 0;
    std::shared_ptr<KVStore> store;
    std::unique_ptr<te::TransferEngine> engine;
    char* window = nullptr;
    uint64_t window_bytes = 0;
    uint64_t* host_words = nullptr;  // [0] abort, [1] current epoch, [2..] result
    DeviceGroupView view;
    cudaStream_t stream = nullptr;

    DeviceOpResult* hostResult() { return reinterpret_cast<DeviceOpResult*>(host_words + 2); }
    DeviceOpResult* deviceResult() {
        void* p = nullptr;
        (void)cudaHostGetDevicePointer(&p, hostResult(), 0);
        return static_cast<DeviceOpResult*>(p);
    }
    void clearResult() { *hostResult() = DeviceOpResult{}; }
    void setAbort(uint64_t v) { reinterpret_cast<volatile uint64_t*>(host_words)[0] = v; }
    void setCurrentEpoch(uint64_t v) { reinterpret_cast<volatile uint64_t*>(host_words)[1] = v; }
};

// All `size` ranks add themselves to `name` and wait until everyone has.
inline Status barrier(KVStore& store, const std::string& name, int size) {
    MC_ASSIGN_OR_RETURN(int64_t arrived, store.add("barrier/" + name, 1));
    Deadline deadline = Deadline::afterMs(kWaitMs);
    while (arrived < size) {
        if (deadline.expired())
            return Timeout("barrier " + name);
        usleep(1000);
        MC_ASSIGN_OR_RETURN(arrived, store.add("barrier/" + name, 0));
    }
    return Status::OK();
}

// Sets up `r` as rank `rank` of `size` with windows of `slot_bytes` slots
// (room for `room_for` ranks), epoch 1. Returns 0 or a failing exit code.
inline int setUp(Rank& r, const std::string& dir, int rank, int size, uint64_t slot_bytes,
                 int room_for = 0) {
    r.rank = rank;
    r.size = size;
    r.store = std::make_shared<FileKVStore>(dir);
    r.engine = te::shm_test::startEngine(r.store, "rank" + std::to_string(rank));
    CHILD_CHECK(r.engine);
    CUDA_CHILD_OK(cudaSetDevice(0));
    r.window_bytes = windowBytes(room_for > size ? room_for : size, slot_bytes);
    auto window = r.engine->allocateDeviceMemory(r.window_bytes, 0);
    CHILD_OK(window.status());
    r.window = static_cast<char*>(window.value());
    CUDA_CHILD_OK(cudaMemset(r.window, 0, r.window_bytes));
    CUDA_CHILD_OK(cudaDeviceSynchronize());
    CHILD_OK(r.store->set("window/" + std::to_string(rank),
                          std::to_string(reinterpret_cast<uint64_t>(r.window))));
    r.view.rank = rank;
    r.view.size = size;
    r.view.slot_bytes = slot_bytes;
    r.view.epoch = 1;
    r.view.timeout_ns = 20'000'000'000;
    // ctest runs several tests at once on the one GPU: small grids keep every
    // group's spinning kernels from crowding out the peers they wait for.
    r.view.max_blocks = 8;
    for (int p = 0; p < size; ++p) {
        if (p == rank) {
            r.view.windows[p] = r.window;
            continue;
        }
        uint64_t addr = te::shm_test::waitAddr(*r.store, "window/" + std::to_string(p));
        CHILD_CHECK(addr != 0);
        auto id = r.engine->openSegment("rank" + std::to_string(p));
        CHILD_OK(id.status());
        auto mapped = r.engine->mapRemote(id.value(), addr, r.window_bytes);
        CHILD_OK(mapped.status());
        r.view.windows[p] = static_cast<char*>(mapped.value());
    }
    void* words = nullptr;
    CUDA_CHILD_OK(cudaHostAlloc(&words, 4096, cudaHostAllocMapped));
    std::memset(words, 0, 4096);
    r.host_words = static_cast<uint64_t*>(words);
    r.setCurrentEpoch(1);
    void* dev_words = nullptr;
    CUDA_CHILD_OK(cudaHostGetDevicePointer(&dev_words, words, 0));
    r.view.abort_word = static_cast<const volatile uint64_t*>(dev_words);
    r.view.current_epoch = static_cast<const volatile uint64_t*>(dev_words) + 1;
    CUDA_CHILD_OK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    CHILD_OK(barrier(*r.store, "setup", size));
    return 0;
}

// One rank's side of sharing its own buffers with the direct collectives:
// its exports and its peers' mappings.
struct Sharing {
    BufferExports exports;
    PeerBufferMappings peers;
};

// Publishes this rank's `in` and `out` (`bytes` each) under `name` in the
// store (the backend uses the host core's exchange instead), maps every
// peer's and fills `b`. Returns 0 or a failing exit code.
inline int shareMemberBuffers(Rank& r, Sharing& s, const std::string& name, const void* in,
                              void* out, uint64_t bytes, MemberBuffers* b) {
    const std::string key = "member_buffers/" + name + "/";
    for (int which = 0; which < 2; ++which) {
        auto d = s.exports.describe(which == 0 ? in : out, bytes);
        CHILD_OK(d.status());
        CHILD_CHECK(d.value().allocation_id != 0);
        CHILD_OK(r.store->set(
            key + std::to_string(which) + "/" + std::to_string(r.rank),
            std::string(reinterpret_cast<const char*>(&d.value()), sizeof(BufferDescriptor))));
    }
    for (int p = 0; p < r.size; ++p) {
        if (p == r.rank) {
            b->inputs[p] = in;
            b->outputs[p] = out;
            continue;
        }
        for (int which = 0; which < 2; ++which) {
            auto v = r.store->get(key + std::to_string(which) + "/" + std::to_string(p),
                                  Deadline::afterMs(kWaitMs));
            CHILD_OK(v.status());
            CHILD_CHECK(v.value().size() == sizeof(BufferDescriptor));
            BufferDescriptor d;
            std::memcpy(&d, v.value().data(), sizeof(d));
            auto mapped = s.peers.map("rank" + std::to_string(p), d, bytes);
            CHILD_OK(mapped.status());
            if (which == 0)
                b->inputs[p] = mapped.value();
            else
                b->outputs[p] = mapped.value();
        }
    }
    return 0;
}

}  // namespace mooncake::pg::device::test
