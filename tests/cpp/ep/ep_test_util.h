// Process plumbing for the EP kernel tests: device memory that frees itself,
// barriers through the FileKVStore, and a bounded wait for a stream. The
// GPU probe (SKIP_WITHOUT_GPU) is tests/cpp/te/cuda_test_util.h's.
#pragma once

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "tests/cpp/te/cuda_test_util.h"
#include "tests/cpp/te/shm_test_util.h"

namespace mooncake::ep::test {

using te::shm_test::Child;
using te::shm_test::TempDir;

// Inside a child: a failed CUDA call ends the body with 1 and says where.
#define CUDA_OK(expr)                                                          \
    do {                                                                       \
        cudaError_t _e = (expr);                                               \
        if (_e != cudaSuccess) {                                               \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                         cudaGetErrorString(_e));                              \
            return 1;                                                          \
        }                                                                      \
    } while (0)

class DeviceMemory {
public:
    explicit DeviceMemory(size_t bytes) : bytes_(bytes < 16 ? 16 : bytes) {
        if (cudaMalloc(&ptr_, bytes_) != cudaSuccess)
            ptr_ = nullptr;
    }
    ~DeviceMemory() {
        if (ptr_)
            (void)cudaFree(ptr_);
    }
    DeviceMemory(const DeviceMemory&) = delete;
    DeviceMemory& operator=(const DeviceMemory&) = delete;
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t bytes() const { return bytes_; }
    bool ok() const { return ptr_ != nullptr; }

private:
    size_t bytes_;
    void* ptr_ = nullptr;
};

// Every rank arrives, then every rank leaves; numbered so each call is fresh.
class Barrier {
public:
    Barrier(KVStore& store, int rank, int num_ranks)
        : store_(store), rank_(rank), num_ranks_(num_ranks) {}
    bool arrive() {
        const std::string prefix = "barrier/" + std::to_string(next_++) + "/";
        if (!store_.set(prefix + std::to_string(rank_), "1").ok())
            return false;
        for (int r = 0; r < num_ranks_; ++r) {
            if (te::shm_test::waitKey(store_, prefix + std::to_string(r)).empty()) {
                std::fprintf(stderr, "rank %d: rank %d never reached %s\n", rank_, r,
                             prefix.c_str());
                return false;
            }
        }
        return true;
    }

private:
    KVStore& store_;
    int rank_;
    int num_ranks_;
    int next_ = 0;
};

// True once the stream's work is done; false on an error or at the deadline
// (the kernels have their own deadlines, this one catches a bug in them).
inline bool waitStream(cudaStream_t stream, int64_t ms, const char* what, int rank) {
    Deadline deadline = Deadline::afterMs(ms);
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess)
            return true;
        if (e != cudaErrorNotReady) {
            std::fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, cudaGetErrorString(e));
            return false;
        }
        if (deadline.expired()) {
            std::fprintf(stderr, "rank %d: %s did not finish in %lld ms\n", rank, what,
                         static_cast<long long>(ms));
            return false;
        }
        ::usleep(200);
    }
}

}  // namespace mooncake::ep::test
