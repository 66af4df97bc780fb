// MooncakeBackend's choice of executor per op (executor.h).
#include <c10/util/Exception.h>

#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/torch/backend.h"
#ifdef MC_PG_WITH_CUDA
#include "mooncake-pg/torch/cuda_executor.h"
#endif

namespace mooncake::pg {

Executor* MooncakeBackend::executorFor(const Staging& staging, const char* op) {
    if (!staging.onCuda())
        return &cpu_executor_;
    const c10::Device device = staging.device();
    // Validated by checkTensor already; kept here so no path reaches CUDA
    // code on a `mooncake-cpu` group.
    TORCH_CHECK(config_.is_cuda, "Mooncake PG: ", op, ": backend '", getBackendName(),
                "' takes CPU tensors, got one on ", device.str());
#ifdef MC_PG_WITH_CUDA
    if (Executor* existing = cuda_executor_ptr_.load(std::memory_order_acquire)) {
        TORCH_CHECK(device == cuda_device_, "Mooncake PG: ", op, ": the tensors are on ",
                    device.str(), " but group '", config_.group_name, "' runs its CUDA ops on ",
                    cuda_device_.str(),
                    " (the device of its first CUDA op); one group uses one GPU per process");
        return existing;
    }
    std::lock_guard<std::mutex> lock(cuda_executor_mu_);
    if (!cuda_executor_) {
        cuda_executor_ = std::make_unique<CudaExecutor>(device, cuda_path_);
        cuda_device_ = device;
        cuda_executor_ptr_.store(cuda_executor_.get(), std::memory_order_release);
    }
    TORCH_CHECK(device == cuda_device_, "Mooncake PG: ", op, ": the tensors are on ", device.str(),
                " but group '", config_.group_name, "' runs its CUDA ops on ", cuda_device_.str(),
                " (the device of its first CUDA op); one group uses one GPU per process");
    return cuda_executor_.get();
#else
    TORCH_CHECK(false, "Mooncake PG: ", op, ": this build of Mooncake PG has no CUDA support (",
                device.str(), " tensor); rebuild with USE_CUDA=ON");
#endif
}

bool MooncakeBackend::coalescedPerTensor(const std::vector<at::Tensor>& tensors) const {
    return config_.is_cuda && cuda_path_ == device::CudaPath::kKernels && !tensors.empty() &&
           tensors.front().is_cuda();
}

#ifndef MC_PG_WITH_CUDA
// Without CUDA no op reaches a device kernel (cuda_collectives.cc).
c10::intrusive_ptr<MooncakeWork> MooncakeBackend::maybeKernel(KernelCall, std::chrono::milliseconds,
                                                              bool) {
    return {};
}
bool MooncakeBackend::mayRunKernels(device::CudaCollective) const {
    return false;
}
void MooncakeBackend::configureCuda() {}
void MooncakeBackend::abortDeviceCalls() {}
void MooncakeBackend::releaseDeviceWindow() {}
void MooncakeBackend::pollKernelCalls() {}
void MooncakeBackend::finishKernelCalls(size_t) {}
void MooncakeBackend::watchGraphReplays() {}
int64_t MooncakeBackend::liveGraphCalls() const {
    return 0;
}
void MooncakeBackend::forgetGraphFailures() {}
void MooncakeBackend::GroupWindowDeleter::operator()(device::GroupWindow*) const {}
// Without CUDA there are no CUDA tensors, so no P2P on device pools.
P2PEngine* MooncakeBackend::deviceP2PFor(const at::Tensor&, const char*) {
    return nullptr;
}
c10::intrusive_ptr<MooncakeWork> MooncakeBackend::devicePointToPoint(P2PEngine&, bool,
                                                                     const at::Tensor&, int, int) {
    TORCH_CHECK(false, "Mooncake PG: P2P on device pools needs a CUDA build");
}
void MooncakeBackend::applyDeviceP2PView() {}
void MooncakeBackend::applyDeviceP2PViewLocked(P2PEngine&) {}
void MooncakeBackend::publishDeviceP2PRoute() {}
std::shared_ptr<P2PEngine> MooncakeBackend::releaseDeviceP2P(int64_t) {
    return nullptr;
}
#endif

}  // namespace mooncake::pg
