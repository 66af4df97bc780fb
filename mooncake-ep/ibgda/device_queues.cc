#include "mooncake-ep/ibgda/device_queues.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace mooncake::ep {
namespace {

struct Span {
    uintptr_t begin;
    uintptr_t end;
    bool io;
};

Status cudaFailed(const char* call, cudaError_t err, const std::string& what) {
    (void)cudaGetLastError();
    return Internal(std::string(call) + " (" + what + "): " + cudaGetErrorString(err));
}

// The device address of host address `p`, inside a registered page.
template <typename T>
Result<T*> deviceAddress(T* p, const char* what) {
    void* d = nullptr;
    const cudaError_t err = cudaHostGetDevicePointer(&d, const_cast<void*>(static_cast<const volatile void*>(p)), 0);
    if (err != cudaSuccess)
        return cudaFailed("cudaHostGetDevicePointer", err, what);
    return static_cast<T*>(d);
}

}  // namespace

Result<std::unique_ptr<IbgdaDeviceQueues>> IbgdaDeviceQueues::map(
    const te::rdma::IbgdaQueuePair& qp) {
    // Whole pages, merged where they touch: two small records may share one.
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    std::vector<Span> spans;
    for (const auto& r : qp.ranges()) {
        const auto a = reinterpret_cast<uintptr_t>(r.addr);
        spans.push_back({a & ~(page - 1), (a + r.bytes + page - 1) & ~(page - 1), r.io});
    }
    std::sort(spans.begin(), spans.end(),
              [](const Span& x, const Span& y) { return x.begin < y.begin; });
    std::vector<Span> merged;
    for (const Span& s : spans) {
        if (!merged.empty() && s.begin <= merged.back().end && s.io == merged.back().io)
            merged.back().end = std::max(merged.back().end, s.end);
        else
            merged.push_back(s);
    }
    std::unique_ptr<IbgdaDeviceQueues> self(new IbgdaDeviceQueues());
    for (const Span& s : merged) {
        void* p = reinterpret_cast<void*>(s.begin);
        const size_t bytes = s.end - s.begin;
        unsigned flags = cudaHostRegisterMapped | (s.io ? cudaHostRegisterIoMemory : 0u);
        cudaError_t err = cudaHostRegister(p, bytes, flags);
        if (err != cudaSuccess && s.io) {
            // Not MMIO after all (a software provider's doorbell word).
            (void)cudaGetLastError();
            err = cudaHostRegister(p, bytes, cudaHostRegisterMapped);
        }
        if (err == cudaErrorHostMemoryAlreadyRegistered) {
            (void)cudaGetLastError();
            continue;  // pinned by someone else: used, not ours to unpin
        }
        if (err != cudaSuccess)
            return cudaFailed("cudaHostRegister", err,
                              std::string(s.io ? "the doorbell register" : "IBGDA queues"));
        self->registered_.push_back(p);
    }
    const te::rdma::mlx5::SendQueue& hsq = qp.sendQueue();
    const te::rdma::mlx5::CompletionQueue& hcq = qp.completionQueue();
    self->sq_ = hsq;
    self->cq_ = hcq;
    MC_ASSIGN_OR_RETURN(self->sq_.wqes, deviceAddress(hsq.wqes, "send queue"));
    MC_ASSIGN_OR_RETURN(self->sq_.dbrec, deviceAddress(hsq.dbrec, "send doorbell record"));
    MC_ASSIGN_OR_RETURN(self->sq_.doorbell, deviceAddress(hsq.doorbell, "doorbell register"));
    MC_ASSIGN_OR_RETURN(self->cq_.cqes, deviceAddress(hcq.cqes, "completion queue"));
    MC_ASSIGN_OR_RETURN(self->cq_.dbrec, deviceAddress(hcq.dbrec, "CQ doorbell record"));
    return self;
}

IbgdaDeviceQueues::~IbgdaDeviceQueues() {
    for (void* p : registered_)
        (void)cudaHostUnregister(p);
}

}  // namespace mooncake::ep
