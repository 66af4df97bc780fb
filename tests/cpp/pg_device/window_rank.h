// One forked rank holding a GroupWindow (group_window.h) as the `mooncake`
// backend does: a file store, a shm/cuda_ipc engine, a window for up to 4
// ranks and a stream; and an exact all_reduce through it. Shared by the
// window and graph tests.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/group_window.h"
#include "mooncake-pg/device/routing.h"
#include "tests/cpp/pg_device/device_group_util.h"

namespace mooncake::pg::device::test {

struct WindowRank {
    std::shared_ptr<KVStore> store;
    std::unique_ptr<te::TransferEngine> engine;
    std::unique_ptr<GroupWindow> window;
    cudaStream_t stream = nullptr;
};

inline std::string segment(int r) {
    return "rank" + std::to_string(r);
}

inline int start(WindowRank& w, const std::string& dir, int rank, uint64_t slot) {
    w.store = std::make_shared<FileKVStore>(dir);
    w.engine = te::shm_test::startEngine(w.store, segment(rank));
    CHILD_CHECK(w.engine);
    CUDA_CHILD_OK(cudaSetDevice(0));
    GroupWindowOptions o;
    o.rank = rank;
    o.max_group_size = 4;
    o.cuda_device = 0;
    o.slot_bytes = slot;
    o.key_prefix = "group";
    o.segment = segment(rank);
    auto created = GroupWindow::create(*w.engine, *w.store, o);
    CHILD_OK(created.status());
    w.window = std::move(created.value());
    CHILD_CHECK(w.window->windowBytes() == 4096 + 2 * 4 * slot);
    CUDA_CHILD_OK(cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking));
    return 0;
}

// One float sum all_reduce of `count` elements over the window's view;
// every rank contributes (rank + 1) * (i % 97 + 1).
inline int sumOnce(WindowRank& w, int rank, const std::vector<int>& members, size_t count,
                   float* d) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i)
        in[i] = static_cast<float>((rank + 1) * (i % 97 + 1));
    CUDA_CHILD_OK(
        cudaMemcpyAsync(d, in.data(), count * sizeof(float), cudaMemcpyHostToDevice, w.stream));
    auto call = w.window->nextCall(20'000'000'000, w.stream);
    CHILD_OK(call.status());
    DeviceGroupView v = call.value();
    CHILD_CHECK(v.seq_on_device);
    v.max_blocks = 8;  // ctest runs GPU tests side by side
    w.window->clearResult();
    CHILD_OK(allReduce(v, d, d, count, DataType::kFloat32, ReduceOp::kSum, /*seq=*/0,
                       w.window->deviceResult(), w.stream));
    CUDA_CHILD_OK(cudaStreamSynchronize(w.stream));
    std::vector<int> failed;
    CHILD_OK(resultStatus(w.window->hostResult(), "all_reduce", &failed));
    CUDA_CHILD_OK(cudaMemcpy(out.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost));
    float ranks = 0;
    for (int m : members)
        ranks += static_cast<float>(m + 1);
    for (size_t i = 0; i < count; ++i)
        CHILD_CHECK(out[i] == ranks * static_cast<float>(i % 97 + 1));
    return 0;
}

}  // namespace mooncake::pg::device::test
