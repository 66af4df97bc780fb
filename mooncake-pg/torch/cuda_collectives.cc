// MooncakeBackend's device collectives on CUDA tensors: the route decision
// at issue, the group window, the kernels queued on the communication
// stream, host evidence turned into the abort word while they run, and
// their result turned into the op's Status (docs/design/pg-cuda.md).
//
// Which path a call takes depends only on what every rank of the call agrees
// on (MC_PG_CUDA_PATH, the collective, dtype, op, count, group size), so all
// ranks take the same one. On the worker, a call the kernels took runs on
// them when the applied view suits them (every rank below the view's size
// active, the blocks of the tensors matching it), else through the host core
// on host copies: ranks that applied the same view decide the same.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/device/all_gather.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/all_to_all.h"
#include "mooncake-pg/device/broadcast.h"
#include "mooncake-pg/device/call_seq.h"
#include "mooncake-pg/device/group_window.h"
#include "mooncake-pg/device/live_graph_calls.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-pg/device/reduce_scatter.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/collective_tensors.h"
#include "mooncake-pg/torch/cuda_executor.h"
#include "mooncake-pg/torch/store_adapter.h"
#include "mooncake-pg/torch/window_launch.h"

namespace mooncake::pg {

using namespace collective_tensors;  // NOLINT(build/namespaces): the op family's helpers

namespace {

bool movesBlocks(device::CudaCollective c) {
    return c == device::CudaCollective::kAllGather || c == device::CudaCollective::kReduceScatter ||
           c == device::CudaCollective::kAllToAll || c == device::CudaCollective::kAllToAllV;
}

bool rooted(device::CudaCollective c) {
    return c == device::CudaCollective::kGather || c == device::CudaCollective::kScatter;
}

// Block r of the call's contiguous output into its list, for the ranks
// whose blocks were written (`written`, or all of them when null). Blocks
// lie in list order, each the size of its list tensor (equal for the
// gathers, per peer for all_to_all).
void copyOutputBlocks(const KernelCall& call, const std::vector<uint8_t>* written) {
    int64_t offset = 0;
    for (size_t r = 0; r < call.output_blocks.size(); ++r) {
        const at::Tensor& to = call.output_blocks[r];
        if (written == nullptr || blockWritten(*written, r))
            to.copy_(call.output.narrow(0, offset, to.numel()).view(to.sizes()));
        offset += to.numel();
    }
}

}  // namespace

Status launchOnWindow(const KernelCall& call, const device::DeviceGroupView& view, const void* src,
                      void* dst, device::DeviceOpResult* result, cudaStream_t stream) {
    constexpr uint64_t seq = 0;  // the call counter numbers it (nextCall)
    switch (call.collective) {
        case device::CudaCollective::kAllReduce:
        case device::CudaCollective::kReduce:
            return device::allReduce(
                view, src, dst, call.count, call.dtype, call.op, seq, result, stream,
                call.collective == device::CudaCollective::kReduce ? call.root : -1);
        case device::CudaCollective::kAllGather:
            return device::allGather(view, src, dst, call.count, call.dtype, seq, result, stream);
        case device::CudaCollective::kReduceScatter:
            return device::reduceScatter(view, src, dst, call.count, call.dtype, call.op, seq,
                                         result, stream);
        case device::CudaCollective::kAllToAll:
            return device::allToAll(view, src, dst, call.count, call.dtype, seq, result, stream);
        case device::CudaCollective::kBroadcast:
            return device::broadcast(view, dst, call.count, call.dtype, call.root, seq, result,
                                     stream);
        // Off the root, a gather's output and a scatter's input are the
        // rank's own tensor (in place), which the kernels leave alone.
        case device::CudaCollective::kGather:
            return device::gather(view, src, call.root == view.rank ? dst : nullptr, call.count,
                                  call.dtype, call.root, seq, result, stream);
        case device::CudaCollective::kScatter:
            return device::scatter(view, call.root == view.rank ? src : nullptr, dst, call.count,
                                   call.dtype, call.root, seq, result, stream);
        default:
            return Internal(std::string("no window kernel for ") + call.op_name);
    }
}

void MooncakeBackend::GroupWindowDeleter::operator()(device::GroupWindow* w) const {
    delete w;
}

void MooncakeBackend::configureCuda() {
    auto path = device::parseCudaPath(std::getenv(device::kCudaPathEnv));
    TORCH_CHECK_VALUE(path.ok(), "Mooncake PG: ", path.status().message());
    auto slot = device::parseSlotBytes(std::getenv(device::kCudaSlotBytesEnv));
    TORCH_CHECK_VALUE(slot.ok(), "Mooncake PG: ", slot.status().message());
    auto blocking = device::parseBlockingWait(std::getenv(device::kCudaBlockingWaitEnv));
    TORCH_CHECK_VALUE(blocking.ok(), "Mooncake PG: ", blocking.status().message());
    auto direct = device::parseDirect(std::getenv(device::kCudaDirectEnv));
    TORCH_CHECK_VALUE(direct.ok(), "Mooncake PG: ", direct.status().message());
    auto p2p_pool = device::parseP2PPoolBytes(std::getenv(device::kCudaP2PPoolBytesEnv));
    TORCH_CHECK_VALUE(p2p_pool.ok(), "Mooncake PG: ", p2p_pool.status().message());
    cuda_p2p_.pool_bytes = p2p_pool.value();
    auto p2p_copy = device::parseP2PCopyWithKernel(std::getenv(device::kCudaP2PCopyEnv));
    TORCH_CHECK_VALUE(p2p_copy.ok(), "Mooncake PG: ", p2p_copy.status().message());
    cuda_p2p_.copy_with_kernel = p2p_copy.value();
    graphs_.live_calls = std::make_shared<device::LiveGraphCalls>();
    cuda_direct_ = direct.value();
    cuda_path_ = path.value();
    cuda_slot_bytes_ = slot.value();
    cuda_blocking_wait_ = blocking.value();
    auto caller_launch = device::parseCallerLaunch(std::getenv(device::kCudaCallerLaunchEnv));
    TORCH_CHECK_VALUE(caller_launch.ok(), "Mooncake PG: ", caller_launch.status().message());
    cuda_caller_launch_ = caller_launch.value();
}

bool MooncakeBackend::mayRunKernels(device::CudaCollective collective) const {
    if (!config_.is_cuda || cuda_path_ != device::CudaPath::kKernels)
        return false;
    // Windows hold a slot per reserved rank: at most kMaxDeviceRanks.
    if (max_group_size_ > device::kMaxDeviceRanks || !fabric_)
        return false;
    // all_to_all with split sizes runs only on the direct path (every rank
    // reads MC_PG_CUDA_DIRECT alike: bootstrap compares it).
    return collective != device::CudaCollective::kAllToAllV || cuda_direct_;
}

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::maybeKernel(KernelCall call,
                                                              std::chrono::milliseconds timeout,
                                                              bool async_op) {
    if (!call.output.is_cuda() || !mayRunKernels(call.collective))
        return {};
    device::RouteQuery q;
    q.collective = call.collective;
    q.dtype = call.dtype;
    q.op = call.op;
    q.count = call.count;
    q.group_size = groupSize();
    Staging st(call.op_name);
    st.onDevice(call.input, "input");
    st.onDevice(call.output, "output");
    for (const auto& t : call.output_blocks)
        st.onDevice(t, "output list");
    for (const auto& t : call.held)
        st.onDevice(t, "input list");
    auto* exec = static_cast<CudaExecutor*>(executorFor(st, call.op_name));
    if (exec->route(q) != device::CudaRoute::kKernel)
        return {};
    // A reduce's scratch output would be allocated in the capture's pool and
    // dropped at once: it stays out of graphs (docs/pg-user-guide.md).
    // all_to_all with split sizes exchanges its rows through the host per
    // call, which a replay cannot. The list forms (a list packed or
    // unpacked around the kernels) stay out too.
    const bool list_form = !call.output_blocks.empty() || !call.held.empty();
    if (!list_form && call.collective != device::CudaCollective::kReduce &&
        call.collective != device::CudaCollective::kAllToAllV &&
        call.collective != device::CudaCollective::kGather &&
        call.collective != device::CudaCollective::kScatter)
        st.allowCapture();
    call.captured = exec->callerCapturing();
    st.setCallerCapturing(call.captured);
    // torch waits for a synchronous op at once: on the caller's stream the
    // kernels need no event to follow its work, nor its stream one to
    // follow them (the NCCL backend does the same).
    if (!async_op && !call.captured) {
        st.onCallerStream();
        if (auto work = maybeLaunchOnCaller(call, *exec, timeout))
            return work;
    }
    const c10d::OpType type = call.type;
    const char* op_name = call.op_name;
    at::Tensor output = call.work_output.defined() ? call.work_output : call.output;
    std::vector<at::Tensor> results = call.results.value_or(std::vector<at::Tensor>{output});
    const GroupSized sized = rooted(call.collective)        ? GroupSized::kRooted
                             : movesBlocks(call.collective) ? GroupSized::kBlocks
                                                            : GroupSized::kNo;
    if (call.captured) {
        // On the capturing thread, which is not adding to the graph
        // meanwhile (graph objects are not thread-safe), and before the
        // worker can see the call: it watches while the count is nonzero.
        graphs_.live_calls->holdUntilGraphDestroyed(
            c10::cuda::getCurrentCUDAStream(exec->device().index()).stream());
    }
    return enqueue(
        type, op_name, std::move(results), timeout, sized, std::move(st),
        [this, call = std::move(call)](Deadline dl) { return runKernelCall(call, dl); },
        /*kernel_call=*/true);
}

Status MooncakeBackend::runKernelCall(const KernelCall& call, Deadline deadline) {
    auto* exec = static_cast<CudaExecutor*>(cuda_executor_ptr_.load(std::memory_order_acquire));
    if (!exec)
        return Internal("device collective without a CUDA executor");
    c10::cuda::CUDAGuard guard(exec->device());
    // The applied view: every rank below its size active, this one included.
    const std::vector<uint8_t>& active = comm_->active();
    int size = 0;
    for (size_t r = 0; r < active.size(); ++r) {
        if (active[r] != 0)
            size = static_cast<int>(r) + 1;
    }
    bool suits = comm_ == group_comm_.get() && size >= 2 && size <= device::kMaxDeviceRanks;
    // cuda_ipc maps peers on this host only: a member reached over the
    // network (its host window is not mapped either) rules the kernels out,
    // on every rank of a group that spans hosts.
    for (int r = 0; suits && r < size; ++r)
        suits = active[r] != 0 && (r == config_.rank || fabric_->peerWindow(r) != nullptr);
    if (call.blocks > 0)
        suits = suits && size == call.blocks;
    if (call.collective == device::CudaCollective::kBroadcast ||
        call.collective == device::CudaCollective::kReduce || rooted(call.collective))
        suits = suits && call.root < size;
    if (!suits && call.captured) {
        return InvalidArgument(std::string(call.op_name) +
                               " cannot be captured in a CUDA graph in this membership view: the "
                               "device kernels need every rank below the group's size active and "
                               "on this host, and tensors sized for that many ranks");
    }
    if (!suits)
        return runOnHost(call, deadline);
    // From here a failure's ranks are kernel_failed_, never the
    // Communicator's last failure (an earlier call's).
    kernel_ran_ = true;
    if (!device_stuck_.empty())
        return Internal(std::string(call.op_name) + ": " + device_stuck_);
    if (call.captured) {
        // A capture must not set the device state up: the window's creation
        // is collective, and a new epoch's first call restarts the numbering,
        // which every replay would repeat.
        const bool current = device_window_ && device_window_->hasView() &&
                             device_window_->epoch() == deviceEpochOf(applied_epoch_.load()) &&
                             device_window_->size() == size &&
                             latest_epoch_.load() == applied_epoch_.load();
        if (!current) {
            return InvalidArgument(
                std::string(call.op_name) +
                " cannot be captured in a CUDA graph before the group ran a device collective "
                "outside the graph in its current membership: run one (a warm-up call) before "
                "capturing, and again after every membership change");
        }
    }
    MC_RETURN_IF_ERROR(setUpDeviceWindow(size, deadline));
    device::GroupWindow& w = *device_window_;
    const int64_t timeout_ns = std::min(deadline.remaining(), kMaxKernelWait).count();
    // The op's stream (beforeCore made it current): the group's, or the
    // caller's for a synchronous op.
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(exec->device().index()).stream();
    // The window's calls run in call order: one queued on another stream
    // than the previous one first waits for it.
    struct QueuedInOrder {
        CudaExecutor& exec;
        cudaStream_t stream;
        bool captured;
        ~QueuedInOrder() {
            if (!captured)
                exec.callQueued(stream);
        }
    } in_order{*exec, stream, call.captured};
    if (!call.captured) {
        Status ordered = exec->followPreviousCall(stream);
        if (ordered.code() == StatusCode::kUnavailable) {
            // Once the previous call has ended, nothing is left to follow.
            finishKernelCalls(0);
            ordered = exec->followPreviousCall(stream);
        }
        if (!ordered.ok())
            return ordered.withContext(call.op_name);
    }
    auto next = w.nextCall(timeout_ns, stream, call.captured);
    if (!next.ok())
        return next.status().withContext(call.op_name);
    const device::DeviceGroupView view = next.value();
    // The peers count this call whether or not it is queued here: a rank
    // that did not advance its call counter would wait for tags one call
    // behind for the rest of the epoch.
    struct SkipUnlessQueued {
        const device::DeviceGroupView& view;
        cudaStream_t stream;
        bool queued = false;
        ~SkipUnlessQueued() {
            if (!queued)
                (void)device::skipCall(view, stream);
        }
    } numbered{view, stream};
    // Evidence against earlier calls still in flight stays set for them (it
    // holds for this call too); with none in flight it was for calls done.
    if (kernels_in_flight_.empty())
        w.clearAbort();
    // A captured call reports to the graph result at every replay. Otherwise
    // the worker keeps fewer calls in flight than there are slots
    // (settleBefore).
    const int slot = call.captured ? device::GroupWindow::kGraphResultSlot : takeResultSlot(w);
    constexpr uint64_t seq = 0;  // the call counter numbers it (nextCall)

    // Contiguous stand-ins, made on the communication stream (current here).
    const bool in_place = call.input.is_same(call.output);
    at::Tensor dst = in_place ? inOutBuffer(call.output) : outBuffer(call.output);
    at::Tensor src = in_place ? dst : inBuffer(call.input, call.output);
    device::DeviceOpResult* result = w.deviceResult(slot);
    // A rank's part: the whole message of all_reduce, one block otherwise.
    const uint64_t bytes = static_cast<uint64_t>(call.count) * dataTypeSize(call.dtype);
    Status launched;
    switch (call.collective) {
        case device::CudaCollective::kAllReduce:
        case device::CudaCollective::kReduce: {
            const int reduce_root =
                call.collective == device::CudaCollective::kReduce ? call.root : -1;
            device::MemberBuffers members;
            MC_ASSIGN_OR_RETURN(const bool direct,
                                maybeDirect(call, bytes, ptrOf(src), bytes, ptrOf(dst), bytes, true,
                                            size, deadline, &members));
            launched = direct ? device::directAllReduce(view, members, call.count, call.dtype,
                                                        call.op, seq, result, stream, reduce_root)
                              : launchOnWindow(call, view, ptrOf(src), ptrOf(dst), result, stream);
            break;
        }
        case device::CudaCollective::kAllGather: {
            device::MemberBuffers members;
            MC_ASSIGN_OR_RETURN(const bool direct,
                                maybeDirect(call, bytes * size, ptrOf(src), bytes, ptrOf(dst),
                                            bytes * size, false, size, deadline, &members));
            launched = direct ? device::directAllGather(view, members, call.count, call.dtype, seq,
                                                        result, stream)
                              : launchOnWindow(call, view, ptrOf(src), ptrOf(dst), result, stream);
            break;
        }
        case device::CudaCollective::kReduceScatter: {
            device::MemberBuffers members;
            MC_ASSIGN_OR_RETURN(const bool direct,
                                maybeDirect(call, bytes * size, ptrOf(src), bytes * size,
                                            ptrOf(dst), bytes, false, size, deadline, &members));
            launched = direct ? device::directReduceScatter(view, members, call.count, call.dtype,
                                                            call.op, seq, result, stream)
                              : launchOnWindow(call, view, ptrOf(src), ptrOf(dst), result, stream);
            break;
        }
        case device::CudaCollective::kAllToAll: {
            // The members read this rank's input while it writes its output:
            // with the two overlapping it offers nothing (a null input), and
            // every member takes the window path.
            const uint64_t total = bytes * size;
            const bool overlap = device::bytesOverlap(ptrOf(src), ptrOf(dst), total);
            device::MemberBuffers members;
            MC_ASSIGN_OR_RETURN(const bool direct,
                                maybeDirect(call, total, overlap ? nullptr : ptrOf(src), total,
                                            ptrOf(dst), total, false, size, deadline, &members));
            launched = direct ? device::directAllToAll(view, members, call.count, call.dtype, seq,
                                                       result, stream)
                              : launchOnWindow(call, view, ptrOf(src), ptrOf(dst), result, stream);
            break;
        }
        case device::CudaCollective::kAllToAllV: {
            MC_ASSIGN_OR_RETURN(const bool direct, directAllToAllV(call, view, ptrOf(src),
                                                                   ptrOf(dst), result, deadline));
            if (!direct) {
                // A member's buffers cannot be shared, as every rank saw: the
                // host core moves it (the numbered call is skipped on the device).
                Status hosted = runOnHost(call, deadline);
                if (!hosted.ok())
                    kernel_failed_ = comm_->lastFailure().failed_ranks;
                return hosted;
            }
            launched = Status::OK();
            break;
        }
        default:
            launched = launchOnWindow(call, view, ptrOf(src), ptrOf(dst), result, stream);
            break;
    }
    // Arguments were checked at issue: a refusal here is a bug, not a
    // mismatch between ranks (kInvalidArgument would read as one).
    if (!launched.ok())
        return Internal("queuing the device " + std::string(call.op_name) + ": " +
                        launched.toString());
    numbered.queued = true;
    device_calls_.fetch_add(1);
    // In stream order after the kernels: a failed call's output holds
    // whatever they wrote, as on the contiguous path.
    copyBack(call.output, dst);
    copyOutputBlocks(call, nullptr);
    if (call.captured) {
        // Nothing to wait for now: the kernels run at each replay, which
        // reports to the graph result (checkGraphReplays), watched by the
        // worker while the graph exists (maybeKernel tied the count to it).
        graphs_.captured_calls.fetch_add(1);
        graphs_.owed.store(true);
        return Status::OK();
    }
    kernel_launch_ = KernelLaunch{slot, size, applied_epoch_.load(), timeout_ns};
    // A synchronous call after this one may be launched by its caller in
    // this view (maybeLaunchOnCaller), unless evidence is against it.
    if (w.abortReason() == 0)
        caller_launch_ready_.store(true, std::memory_order_release);
    return Status::OK();
}

int MooncakeBackend::takeResultSlot(device::GroupWindow& w) {
    const int slot = next_result_slot_;
    next_result_slot_ = (slot + 1) % device::GroupWindow::kResultSlots;
    w.clearResult(slot);
    return slot;
}

Status MooncakeBackend::setUpDeviceWindow(int size, Deadline deadline) {
    auto* exec = static_cast<CudaExecutor*>(cuda_executor_ptr_.load(std::memory_order_acquire));
    if (!device_window_) {
        device::GroupWindowOptions o;
        o.rank = config_.rank;
        o.max_group_size = max_group_size_;
        o.cuda_device = exec->device().index();
        o.slot_bytes = cuda_slot_bytes_;
        o.key_prefix = group_key_;
        o.segment = EngineFabric::segmentOf(fabric_->endpoint());
        auto created = device::GroupWindow::create(fabric_->engine(), *store_, o);
        if (!created.ok())
            return created.status().withContext("setting up the group's device collectives");
        device_window_.reset(created.value().release());
        device_window_ptr_.store(device_window_.get(), std::memory_order_release);
    }
    const uint64_t epoch = deviceEpochOf(applied_epoch_.load());
    if (device_window_->hasView() && device_window_->epoch() == epoch &&
        device_window_->size() == size)
        return Status::OK();
    // Callers launch in the new view only after the worker has (runKernelCall).
    caller_launch_ready_.store(false);
    return device_window_->applyView(fabric_->peerSegments(size), epoch, deadline);
}

Status MooncakeBackend::runOnHost(const KernelCall& call, Deadline deadline) {
    auto* exec = static_cast<CudaExecutor*>(cuda_executor_ptr_.load(std::memory_order_acquire));
    const bool in_place = call.input.is_same(call.output);
    at::Tensor dst = inOutBuffer(call.output);  // blocks the core skips keep their values
    at::Tensor src = in_place ? dst : inBuffer(call.input, call.output);
    const auto pinned = [](const at::Tensor& t) {
        return at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
    };
    at::Tensor host_out = pinned(dst);
    host_out.copy_(dst, /*non_blocking=*/true);
    at::Tensor host_in = host_out;
    if (!in_place) {
        host_in = pinned(src);
        host_in.copy_(src, /*non_blocking=*/true);
    }
    MC_RETURN_IF_ERROR(exec->drain(deadline, "copying the inputs to the host"));
    MC_RETURN_IF_ERROR(call.host_core(ptrOf(host_in), ptrOf(host_out), deadline));
    dst.copy_(host_out, /*non_blocking=*/true);
    copyBack(call.output, dst);
    copyOutputBlocks(call, &comm_->active());
    // The pinned copies must outlive the copy back, which is queued only.
    return exec->drain(deadline, "copying the results back to the device");
}

void MooncakeBackend::checkGraphReplays() {
    device::GroupWindow* w = device_window_ptr_.load(std::memory_order_acquire);
    if (!w)
        return;
    device::DeviceOpResult r;
    {
        std::lock_guard<std::mutex> lock(graphs_.mu);
        r = w->graphResult();
        if (r.status == 0)
            return;
        w->clearGraphResult();
        // Not reported yet: the worker reports it (watchGraphReplays).
        if (!graphs_.failure_taken && device::isFailureEvidence(r))
            graphs_.evidence = GraphWatch::Failure{r, applied_epoch_.load()};
        graphs_.failure_taken = false;
    }
    std::vector<int> failed;
    Status st = device::resultStatus(r, "a collective replayed from a CUDA graph", &failed);
    std::string message = "Mooncake PG: " + st.message();
    if (r.status == static_cast<int32_t>(device::DeviceStatus::kStaleEpoch)) {
        message +=
            " (the membership changed after the graph was captured: capture it again, "
            "after one device collective outside the graph)";
    }
    for (size_t i = 0; i < failed.size(); ++i)
        message += (i == 0 ? " [failed ranks: " : " ") + std::to_string(failed[i]);
    if (!failed.empty())
        message += "]";
    TORCH_CHECK_WITH(DistBackendError, false, message);
}

void MooncakeBackend::abortDeviceCalls() {
    if (device::GroupWindow* w = device_window_ptr_.load(std::memory_order_acquire))
        w->setAbort(device::kAbortGroupAborted);
}

void MooncakeBackend::releaseDeviceWindow() {
    device_window_ptr_.store(nullptr, std::memory_order_release);
    device_window_.reset();
}

}  // namespace mooncake::pg
