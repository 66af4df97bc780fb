#include "mooncake-ep/ibgda/device_queues.h"

#include "mooncake-ep/ibgda/pinned_pages.h"

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
    const cudaError_t err =
        cudaHostGetDevicePointer(&d, const_cast<void*>(static_cast<const volatile void*>(p)), 0);
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
        // Pages another queue pair shares stay pinned while either uses them.
        MC_ASSIGN_OR_RETURN(std::vector<uintptr_t> held,
                            processPinnedPages().acquire(s.begin, s.end, s.io));
        self->held_.insert(self->held_.end(), held.begin(), held.end());
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
    processPinnedPages().release(held_);
}

}  // namespace mooncake::ep
