// MooncakeBackend's P2P on CUDA tensors over device pools
// (device/p2p_pools.h, docs/design/pg-cuda.md "P2P on device pools").
//
// A second P2PEngine, its rings in the host window like the first one's,
// its pools in device memory: a send's chunks are copied by the copy
// engine from the user's tensor straight into the pool its receiver keeps
// for it, and out of that pool into the receiver's tensor; the host only
// runs the credit protocol. Both copies wait, on the pools' stream, for the
// work the caller had queued on its current stream when it posted the op.
//
// Which path a group's CUDA P2P takes must be the same on every rank, or a
// send on one engine would wait for a recv posted on the other: it depends
// on MC_PG_CUDA_PATH (compared across ranks when the group is created) and
// on whether every member this rank is connected to is on this host, which
// is the same answer everywhere (ranks on one host map each other's
// windows, and a rank elsewhere is unmapped for every other rank). It is
// decided at the group's first CUDA P2P op; a rank joining later from
// another host is refused at its first put (mapping its pools fails).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/device/p2p_pools.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/cuda_executor.h"
#include "mooncake-pg/torch/store_adapter.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/engine/segment.h"

namespace mooncake::pg {

namespace {

constexpr const char* kRouteDevicePools = "device_pools";
constexpr const char* kRouteStaged = "staged";

std::string routeKey(const std::string& group_key) {
    return group_key + "/cuda_p2p_route";
}

}  // namespace

void MooncakeBackend::publishDeviceP2PRoute() {
    // Every founder is connected by now; ranks on one host map each other's
    // windows, so rank 0 maps them all exactly when all are on its host.
    bool local = true;
    for (int r = 0; r < config_.size; ++r) {
        if (r != config_.rank)
            local = local && fabric_->peerWindow(r) != nullptr;
    }
    // With the host's identity: a rank joining later from another host
    // refuses the route instead of failing at its first put.
    const Status st = store_->set(routeKey(group_key_),
                                  local ? std::string(kRouteDevicePools) + " " + te::localHostId()
                                        : std::string(kRouteStaged));
    TORCH_CHECK_WITH(DistBackendError, st.ok(), "Mooncake PG: bootstrapping group '",
                     config_.group_name,
                     "' failed: publishing its CUDA P2P route: ", st.toString());
}

P2PEngine* MooncakeBackend::deviceP2PFor(const at::Tensor& tensor, const char* op) {
    if (!tensor.is_cuda() || !config_.is_cuda || cuda_path_ != device::CudaPath::kKernels)
        return nullptr;
    if (P2PEngine* engine = cuda_p2p_.engine_ptr.load(std::memory_order_acquire))
        return engine;
    int route = cuda_p2p_.route.load(std::memory_order_acquire);
    if (route < 0) {
        // One answer for the whole group, rank 0's, published at bootstrap:
        // a rank deciding from its own connections could differ from its
        // peers (a joiner from another host, a slot connected later).
        auto value = store_->get(routeKey(group_key_), Deadline::afterMs(timeout_ms_.load()));
        TORCH_CHECK_WITH(DistBackendError, value.ok(), "Mooncake PG: ", op, " on group '",
                         config_.group_name,
                         "': reading the group's CUDA P2P route: ", value.status().toString());
        const std::string& published = value.value();
        const std::string device_pools = std::string(kRouteDevicePools) + " ";
        route = published.compare(0, device_pools.size(), device_pools) == 0 ? 1 : 0;
        // The founders share rank 0's host; this rank, if it joined from
        // another one, cannot take part (only this rank refuses).
        TORCH_CHECK_VALUE(route == 0 || published.substr(device_pools.size()) == te::localHostId(),
                          "Mooncake PG: ", op, " on group '", config_.group_name,
                          "': the group runs P2P on CUDA tensors over device pools (its founders "
                          "share one host), but this rank (",
                          config_.rank,
                          ") is on another host; set MC_PG_CUDA_PATH=staged on every rank of "
                          "groups that span hosts");
        cuda_p2p_.route.store(route, std::memory_order_release);
        MC_LOG(kInfo, "pg") << "group '" << config_.group_name << "': P2P on CUDA tensors "
                            << (route == 1 ? "on device pools"
                                           : "staged through the host (a member is on another "
                                             "host)");
    }
    if (route == 0)
        return nullptr;
    std::lock_guard<std::mutex> lock(cuda_p2p_.mu);
    if (cuda_p2p_.engine)
        return cuda_p2p_.engine.get();
    Staging st(op);
    st.onDevice(tensor, "tensor");
    auto* exec = static_cast<CudaExecutor*>(executorFor(st, op));
    device::DevicePoolsOptions o;
    o.rank = config_.rank;
    o.max_group_size = max_group_size_;
    o.cuda_device = exec->device().index();
    o.pool_bytes_per_peer = cuda_p2p_.pool_bytes;
    o.copy_with_kernel = cuda_p2p_.copy_with_kernel;
    o.key_prefix = group_key_;
    o.segment = EngineFabric::segmentOf(fabric_->endpoint());
    // The pools are memory of the fabric's engine, published in the group's
    // store: both stay alive as long as the pools.
    auto owner = std::make_shared<
        std::pair<std::shared_ptr<EngineFabric>, std::shared_ptr<C10dStoreAdapter>>>(fabric_,
                                                                                     store_);
    auto pools = device::DevicePools::create(owner, fabric_->engine(), *store_, o);
    TORCH_CHECK_WITH(DistBackendError, pools.ok(), "Mooncake PG: ", op, " on group '",
                     config_.group_name,
                     "': setting up P2P on device pools: ", pools.status().toString());
    cuda_p2p_.pools = std::move(pools).value();
    P2POptions options;
    options.external_pools = true;
    options.pool_bytes_per_peer = cuda_p2p_.pool_bytes;
    options.chunk_bytes = device::p2pChunkBytes(cuda_p2p_.pool_bytes);
    options.window_offset = cuda_p2p_.window_offset;
    cuda_p2p_.engine = std::make_shared<P2PEngine>(fabric_, options, cuda_p2p_.pools);
    // Published under cuda_p2p_.apply_mu after the latest view: a view stored
    // since is applied by applyDeviceP2PView, which then finds the engine.
    std::lock_guard<std::mutex> apply(cuda_p2p_.apply_mu);
    applyDeviceP2PViewLocked(*cuda_p2p_.engine);
    cuda_p2p_.engine_ptr.store(cuda_p2p_.engine.get(), std::memory_order_release);
    return cuda_p2p_.engine.get();
}

void MooncakeBackend::applyDeviceP2PView() {
    // Not under cuda_p2p_.mu: setMembership completes ops, and a
    // completion may post the next op or let the group go.
    std::shared_ptr<P2PEngine> engine;
    {
        std::lock_guard<std::mutex> lock(cuda_p2p_.mu);
        engine = cuda_p2p_.engine;
    }
    std::lock_guard<std::mutex> apply(cuda_p2p_.apply_mu);
    if (engine)
        applyDeviceP2PViewLocked(*engine);
}

void MooncakeBackend::applyDeviceP2PViewLocked(P2PEngine& engine) {
    cuda_p2p_.pools->setPeerSegments(fabric_->peerSegments(max_group_size_));
    std::vector<uint8_t> active;
    std::vector<uint64_t> pair_epochs;
    {
        std::lock_guard<std::mutex> lock(p2p_membership_mu_);
        if (p2p_active_.empty())
            return;  // every rank active in pair epoch 0, as the engine starts
        active = p2p_active_;
        pair_epochs = p2p_pair_epochs_;
    }
    // Under cuda_p2p_.apply_mu, so a later view is never overtaken by an older
    // one; the engine skips a view it already has.
    const Status st = engine.setMembership(active, pair_epochs);
    if (!st.ok())
        MC_LOG(kWarn, "pg") << "device P2P membership: " << st.toString();
}

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::devicePointToPoint(P2PEngine& engine,
                                                                     bool is_send,
                                                                     const at::Tensor& user,
                                                                     int peer, int tag) {
    const bool any_source = peer < 0;
    const char* op = is_send ? "send" : "recv";
    Staging st(op);
    st.onDevice(user, "tensor");
    auto* exec = static_cast<CudaExecutor*>(executorFor(st, op));
    TORCH_CHECK(!exec->callerCapturing(), "Mooncake PG: ", op, " on group '", config_.group_name,
                "' cannot be captured in a CUDA graph (only all_reduce, all_gather_into_tensor, "
                "reduce_scatter_tensor and all_to_all_single can)");
    c10::cuda::CUDAGuard guard(exec->device());
    // The engine reads a send's buffer and writes a recv's until the op
    // completes; a contiguous stand-in, made on the caller's stream, is
    // held by the completion callback.
    at::Tensor buffer = user;
    if (!user.is_contiguous())
        buffer = is_send ? user.contiguous() : at::empty_like(user, at::MemoryFormat::Contiguous);
    // The op's copies wait for what the caller has queued so far, and for
    // nothing it queues later.
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(exec->device().index()).stream();
    auto ordered = cuda_p2p_.pools->orderAfter(caller);
    TORCH_CHECK_WITH(DistBackendError, ordered.ok(), "Mooncake PG: ", op, " on group '",
                     config_.group_name, "': ", ordered.status().toString());
    std::shared_ptr<const P2POrder> order = std::move(ordered).value();
    // Should a stalled copy queue make the engine give up on the op, its
    // copies may still read or write these later: the allocator must not
    // hand their memory out before the pools' stream has passed them.
    const c10::Stream pool_stream =
        c10::cuda::getStreamFromExternal(cuda_p2p_.pools->stream(), exec->device().index());
    cuda_p2p_.pools->streamInUse();
    user.record_stream(pool_stream);
    if (!buffer.is_same(user))
        buffer.record_stream(pool_stream);

    const c10d::OpType type = is_send      ? c10d::OpType::SEND
                              : any_source ? c10d::OpType::RECVANYSOURCE
                                           : c10d::OpType::RECV;
    auto work = c10::make_intrusive<MooncakeWork>(rank_, type, std::vector<at::Tensor>{user},
                                                  max_group_size_,
                                                  std::vector<c10::Device>{exec->device()});
    // Armed once the copies have completed: synchronize() and the Future's
    // events follow them, as the staged path's fences follow its copies.
    std::shared_ptr<DeviceFence> fence = exec->fenceOn(cuda_p2p_.pools->stream());
    work->addFence(fence);
    const auto timeout = opTimeout(c10d::kUnsetTimeout);
    std::string context = p2pContext(is_send, peer, tag, timeout);
    auto done = [work, user, buffer, fence, context, is_send](Status status, int source) {
        if (status.ok() && !is_send && !buffer.is_same(user)) {
            // On the pools' stream, after the copies into the stand-in (its
            // memory is held for that stream: record_stream at post).
            try {
                at::NoGradGuard no_grad;
                fence->onStream([&] { user.copy_(buffer, /*non_blocking=*/true); });
            } catch (const std::exception& e) {
                status = Internal(std::string("copying into the recv tensor: ") + e.what());
            }
        }
        // Armed on success only: a failed op's copies may be stuck, and a
        // fence behind them would never complete (unarmed, it reads as
        // complete; these ops are never captured in a graph).
        if (status.ok())
            status = CudaExecutor::armFence(*fence);
        if (status.code() == StatusCode::kTimeout) {
            status = Status(status.code(),
                            status.message() +
                                " (a CUDA tensor's send or recv on this group matches only a CUDA "
                                "tensor's: is the peer's op on a CPU tensor?)");
        }
        completeP2PWork(*work, is_send, status, source, context);
    };
    const Deadline deadline = Deadline::after(timeout);
    const size_t bytes = static_cast<size_t>(buffer.numel()) * buffer.element_size();
    void* data = buffer.data_ptr();
    P2PEngine* posted_to = &engine;
    cuda_p2p_.ops.fetch_add(1);
    // Nothing to wait for before posting: the engine queues the copies once
    // the caller's stream has passed `order`.
    postP2P([=](Status view) {
        Status posted = view;
        if (posted.ok()) {
            if (is_send) {
                posted = posted_to->send(
                    data, bytes, peer, tag, deadline,
                    [done, peer](Status s) { done(std::move(s), peer); }, order);
            } else if (any_source) {
                posted = posted_to->recvAny(data, bytes, tag, deadline, done, order);
            } else {
                posted = posted_to->recv(
                    data, bytes, peer, tag, deadline,
                    [done, peer](Status s) { done(std::move(s), peer); }, order);
            }
        }
        if (!posted.ok())
            work->markFailed(context + posted.toString(), {});
    });
    track(work);
    return work;
}

std::shared_ptr<P2PEngine> MooncakeBackend::releaseDeviceP2P(int64_t flush_ms) {
    std::shared_ptr<P2PEngine> engine;
    {
        std::lock_guard<std::mutex> lock(cuda_p2p_.mu);
        cuda_p2p_.engine_ptr.store(nullptr, std::memory_order_release);
        engine = std::move(cuda_p2p_.engine);
    }
    if (engine && engine->onProgressThread()) {
        // Destroyed from one of its completion callbacks: as for the host
        // P2P engine (releaseCore), a thread of its own flushes and joins it.
        std::thread([engine = std::move(engine), flush_ms]() mutable {
            flushP2P(*engine, flush_ms);
            engine.reset();
        }).detach();
    } else if (engine) {
        flushP2P(*engine, flush_ms);
    }
    return engine;
}

}  // namespace mooncake::pg
