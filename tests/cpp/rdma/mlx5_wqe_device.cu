// The WQE encoder run as device code, for mlx5_wqe_device_test.cc: a kernel
// writes a WRITE WQE, the fetch-add that carries its count and the doorbell
// record, the way an IBGDA kernel will.
#include <cuda_runtime.h>

#include "tests/cpp/rdma/mlx5_wqe_device.h"

namespace mooncake::te::rdma::mlx5 {

namespace {

__global__ void encodeWriteThenCount(unsigned char* sq, uint32_t* dbrec, WriteWqe write,
                                     FetchAddWqe count) {
    encodeRdma(sq, write);
    encodeFetchAdd(sq + kBasicBlockBytes, count);
    __threadfence_system();
    updateSendDoorbellRecord(dbrec, count.wqe_index + 1u);
}

std::string cudaWhy(const char* call, cudaError_t err) {
    return std::string(call) + ": " + cudaGetErrorString(err);
}

}  // namespace

std::string encodeOnDevice(const WriteWqe& write, const FetchAddWqe& count,
                           unsigned char sq_out[128], uint32_t dbrec_out[2]) {
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0)
        return "no usable CUDA device (" +
               (err != cudaSuccess ? cudaWhy("cudaGetDeviceCount", err) : "0 devices") + ")";
    unsigned char* sq = nullptr;
    uint32_t* dbrec = nullptr;
    if ((err = cudaMalloc(&sq, 128)) != cudaSuccess)
        return cudaWhy("cudaMalloc", err);
    if ((err = cudaMalloc(&dbrec, 8)) != cudaSuccess) {
        cudaFree(sq);
        return cudaWhy("cudaMalloc", err);
    }
    cudaMemset(sq, 0xcc, 128);
    cudaMemset(dbrec, 0, 8);
    encodeWriteThenCount<<<1, 1>>>(sq, dbrec, write, count);
    err = cudaGetLastError();
    if (err == cudaSuccess)
        err = cudaMemcpy(sq_out, sq, 128, cudaMemcpyDeviceToHost);
    if (err == cudaSuccess)
        err = cudaMemcpy(dbrec_out, dbrec, 8, cudaMemcpyDeviceToHost);
    cudaFree(sq);
    cudaFree(dbrec);
    return err == cudaSuccess ? "" : "ERROR " + cudaWhy("kernel/cudaMemcpy", err);
}

}  // namespace mooncake::te::rdma::mlx5
