// The IBGDA queue code run as device code: one GPU thread posts puts with
// counts into send queues in pinned host memory, reaps their completions and
// retries when the queue is full, while the software HCA executes them from
// a host thread, as a NIC would read the same memory over PCIe. Checks the
// kernel-side ordering (WQE stores, doorbell record, doorbell) for real.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"
#include "tests/cpp/rdma/ibgda_queue_device.h"
#include "tests/cpp/rdma/soft_hca.h"

namespace mooncake::te::rdma {
namespace {

// status: 0 done; 1 timed out; 100 + syndrome on an error completion.
__global__ void postPutsFromOneThread(mlx5::SendQueue sq, mlx5::CompletionQueue cq,
                                      const mlx5::PutWithCount* puts, int n, int* status,
                                      unsigned long long timeout_ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    auto expired = [&] {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        return now - start > timeout_ns;
    };
    mlx5::Completion error;
    for (int i = 0; i < n; ++i) {
        while (!mlx5::postPutWithCount(sq, puts[i])) {
            if (!mlx5::reapCompletions(cq, sq, &error)) {
                *status = 100 + error.syndrome;
                return;
            }
            if (expired()) {
                *status = 1;
                return;
            }
        }
    }
    while (sq.consumer != sq.producer) {
        if (!mlx5::reapCompletions(cq, sq, &error)) {
            *status = 100 + error.syndrome;
            return;
        }
        if (expired()) {
            *status = 1;
            return;
        }
    }
    *status = 0;
}

template <typename T>
T* pinned(size_t count, std::vector<void*>* owned) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocMapped) != cudaSuccess)
        return nullptr;
    std::memset(p, 0, count * sizeof(T));
    owned->push_back(p);
    return static_cast<T*>(p);
}

}  // namespace

std::string postPutsFromKernel(int n, uint32_t wqe_count) {
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0)
        return std::string("no usable CUDA device (") +
               (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")";
    std::vector<void*> owned;
    struct Free {
        std::vector<void*>* p;
        ~Free() {
            for (void* q : *p)
                cudaFreeHost(q);
        }
    } free_all{&owned};
    // Every buffer the HCA or the kernel touches is pinned and mapped.
    std::vector<uint32_t> lengths(n);
    std::vector<size_t> offsets(n);
    size_t total = 0;
    for (int i = 0; i < n; ++i) {
        lengths[i] = i % 5 == 2 ? 0 : static_cast<uint32_t>((i * 53) % 400 + 1);
        offsets[i] = total;
        total += lengths[i];
    }
    auto* source = pinned<unsigned char>(total, &owned);
    auto* destination = pinned<unsigned char>(total, &owned);
    auto* counter = pinned<uint64_t>(1, &owned);
    auto* old_values = pinned<uint64_t>(n, &owned);
    auto* puts = pinned<mlx5::PutWithCount>(n, &owned);
    soft::QueueMemory mem;
    mem.wqes = pinned<unsigned char>(size_t{wqe_count} * mlx5::kBasicBlockBytes, &owned);
    mem.cqes = pinned<unsigned char>(size_t{wqe_count} * mlx5::kCqeBytes, &owned);
    mem.sq_dbrec = pinned<uint32_t>(2, &owned);
    mem.cq_dbrec = pinned<uint32_t>(1, &owned);
    mem.doorbell = pinned<uint64_t>(1, &owned);
    if (!source || !destination || !counter || !old_values || !puts || !mem.wqes ||
        !mem.cqes || !mem.sq_dbrec || !mem.cq_dbrec || !mem.doorbell)
        return "ERROR cudaHostAlloc failed";
    for (size_t i = 0; i < total; ++i)
        source[i] = static_cast<unsigned char>(i * 29 + 3);
    soft::SoftHca hca;
    const uint32_t src_key = hca.registerMemory(source, total);
    const uint32_t dst_key = hca.registerMemory(destination, total);
    const uint32_t counter_key = hca.registerMemory(counter, sizeof(uint64_t));
    const uint32_t old_key = hca.registerMemory(old_values, n * sizeof(uint64_t));
    for (int i = 0; i < n; ++i) {
        mlx5::PutWithCount& p = puts[i];
        p.local_addr = reinterpret_cast<uint64_t>(source + offsets[i]);
        p.lkey = src_key;
        p.remote_addr = reinterpret_cast<uint64_t>(destination + offsets[i]);
        p.rkey = dst_key;
        p.length = lengths[i];
        p.counter_addr = reinterpret_cast<uint64_t>(counter);
        p.counter_rkey = counter_key;
        p.add = 1;
        p.old_value_addr = reinterpret_cast<uint64_t>(old_values + i);
        p.old_value_lkey = old_key;
    }
    const int qp = hca.createQueuePair(wqe_count, wqe_count, mem);
    hca.start();
    // Pinned and mapped: the host addresses are the device's too (UVA).
    const std::string why =
        postPutsOnDevice(hca.sendQueue(qp), hca.completionQueue(qp), puts, n, [] {});
    hca.stop();
    if (!why.empty())
        return why;
    if (!hca.violation().empty())
        return "ERROR the software HCA saw: " + hca.violation();
    if (mlx5::counterValue(counter) != static_cast<uint64_t>(n))
        return "ERROR counter " + std::to_string(mlx5::counterValue(counter)) + ", expected " +
               std::to_string(n);
    if (std::memcmp(source, destination, total) != 0)
        return "ERROR the destination differs from the source";
    for (int i = 0; i < n; ++i) {
        if (old_values[i] != static_cast<uint64_t>(i))
            return "ERROR put " + std::to_string(i) + "'s fetch-add returned " +
                   std::to_string(old_values[i]);
    }
    return "";
}

std::string postPutsOnDevice(const mlx5::SendQueue& sq, const mlx5::CompletionQueue& cq,
                             const mlx5::PutWithCount* puts, int n,
                             const std::function<void()>& pump) {
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0)
        return std::string("no usable CUDA device (") +
               (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")";
    int* status = nullptr;
    if ((err = cudaHostAlloc(&status, sizeof(int), cudaHostAllocMapped)) != cudaSuccess)
        return std::string("ERROR cudaHostAlloc: ") + cudaGetErrorString(err);
    *status = -1;
    postPutsFromOneThread<<<1, 1>>>(sq, cq, puts, n, status, 20ull * 1000 * 1000 * 1000);
    err = cudaGetLastError();
    while (err == cudaSuccess && (err = cudaStreamQuery(nullptr)) == cudaErrorNotReady) {
        err = cudaSuccess;
        pump();
    }
    const int result = *status;
    cudaFreeHost(status);
    if (err != cudaSuccess)
        return std::string("ERROR kernel: ") + cudaGetErrorString(err);
    if (result != 0)
        return "ERROR kernel status " + std::to_string(result) +
               (result == 1 ? " (timed out: completions missing)" : " (100 + error syndrome)");
    return "";
}

}  // namespace mooncake::te::rdma
