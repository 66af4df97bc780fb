// MooncakeBackend: the c10d::Backend of the `mooncake-cpu` and `mooncake`
// backends. It validates tensors at the torch boundary, turns them into
// pointers, sizes and dtypes, and runs the torch-free core:
//   * collectives on one worker thread per backend, in issue order (the
//     core Communicator is not thread-safe, and every rank must issue the
//     same calls in the same order anyway);
//   * send/recv directly on the core P2PEngine, which queues them on its own
//     progress thread, so mismatched orders across ranks cannot deadlock.
//     After a membership change, posts wait for the P2P view on a thread of
//     their own (the P2P poster), never behind collectives.
// Every op returns its Work at once; only Work::wait() blocks.
//
// Teardown may start on one of the backend's own threads (the last reference
// dropped in a Work's callback): see ~MooncakeBackend.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/member_buffers.h"
#include "mooncake-pg/device/routing.h"
#include "mooncake-pg/torch/cuda_p2p_state.h"
#include "mooncake-pg/torch/executor.h"
#include "mooncake-pg/torch/graph_watch.h"
#include "mooncake-pg/torch/kernel_call.h"
#include "mooncake-pg/torch/options.h"
#include "mooncake-pg/torch/staging.h"
#include "mooncake-pg/torch/work.h"
#include "mooncake-pg/torch/worker_task.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {

class C10dStoreAdapter;
class Communicator;
class CudaExecutor;
class EngineFabric;
class P2PEngine;
class Fabric;
class SharedEngine;

namespace device {
class GroupWindow;
}  // namespace device

namespace control_plane {
class CoordinatorHost;
class MemberHost;
struct GroupView;
}  // namespace control_plane

// "torch.float32", as Python users spell dtypes.
std::string dtypeName(c10::ScalarType type);

// Everything resolved at creation (torch's arguments, options, globals).
struct BackendConfig {
    int rank = 0;
    int size = 1;
    // Registered as `mooncake` (CUDA device) rather than `mooncake-cpu`.
    bool is_cuda = false;
    std::chrono::milliseconds timeout{kBackendDefaultTimeout};
    std::string group_name;
    std::string host_ip;
    std::vector<std::string> device_filter;
    // pg.set_transfer_engine's engine; null: the group creates its own.
    std::shared_ptr<SharedEngine> shared_engine;
    c10::intrusive_ptr<MooncakeBackendOptions> options;  // never null
};

class MooncakeBackend : public c10d::Backend {
public:
    // Bootstraps the group through `store` (collective over the group's
    // ranks); throws c10::DistBackendError when that fails.
    MooncakeBackend(const c10::intrusive_ptr<c10d::Store>& store, BackendConfig config);
    ~MooncakeBackend() override;

    const std::string getBackendName() const override;
    c10::intrusive_ptr<Options> getBackendOptions() override;
    void setTimeout(std::chrono::milliseconds timeout) override;
    int64_t timeoutMs() const { return timeout_ms_.load(); }
    // The collective worker's host time since the group began, for
    // benchmarks: whether the caller or the worker sets a small op's pace.
    struct WorkerStats {
        uint64_t ops = 0;        // ops the worker ran (or failed at once)
        uint64_t queued_ns = 0;  // from enqueue to the worker taking them
        uint64_t run_ns = 0;     // running them (for kernel calls: until launched)
        // Synchronous kernel calls the calling thread launched itself
        // (MC_PG_CUDA_CALLER_LAUNCH), not counted in `ops`.
        uint64_t caller_launched = 0;
    };
    WorkerStats workerStats() const {
        return {worker_ops_.load(std::memory_order_relaxed),
                worker_queued_ns_.load(std::memory_order_relaxed),
                worker_run_ns_.load(std::memory_order_relaxed),
                caller_launched_.load(std::memory_order_relaxed)};
    }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const c10d::BroadcastOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const c10d::AllreduceOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const c10d::ReduceOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::GatherOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const c10d::ScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_split_sizes,
                                                 std::vector<int64_t>& input_split_sizes,
                                                 const c10d::AllToAllOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const c10d::AllToAllOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                        int tag) override;
    // dist.recv without src: the Work's _source_rank() names the sender.
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override;

    // Between startCoalescing and endCoalescing every op still runs as soon
    // as it is issued; endCoalescing returns one Work that completes when all
    // of them have.
    bool supportsCoalescing() const override { return true; }
    void startCoalescing() override;
    c10::intrusive_ptr<c10d::Work> endCoalescing() override;

    // Lets queued collectives finish, then releases the group's resources.
    void shutdown() override;
    // Fails queued collectives without running them and makes the running
    // one fail fast, then releases the group's resources.
    void abort() override;

    // The committed membership's size: highest active rank + 1.
    int groupSize() const { return group_size_.load(); }
    int maxGroupSize() const { return max_group_size_; }
    // The active-rank mask, max_group_size int32 entries (the caller's
    // active_ranks tensor when one was given).
    at::Tensor activeRanks() const { return active_ranks_; }
    bool isCuda() const { return config_.is_cuda; }
    // How many collectives ran on the device kernels so far (tests tell the
    // kernel path from the staged one by it).
    uint64_t deviceCollectiveCalls() const { return device_calls_.load(); }
    uint64_t directCollectiveCalls() const { return direct_calls_.load(); }
    // How many P2P ops on CUDA tensors went over device pools (cuda_p2p.cc).
    uint64_t deviceP2POps() const { return cuda_p2p_.ops.load(); }
    // Of those, the calls whose agreement exchange was skipped.
    uint64_t directAgreementsSkipped() const { return direct_agreements_skipped_.load(); }
    // How many device collectives were captured into CUDA graphs.
    uint64_t capturedCollectiveCalls() const { return graphs_.captured_calls.load(); }
    // Of those, how many sit in graphs not destroyed yet; the worker watches
    // replays while any do (watchGraphReplays), and how often it did.
    int64_t liveGraphCalls() const;
    uint64_t graphWatchPasses() const { return graphs_.passes.load(); }
    // No graph holds a captured call and the final pass was made: the worker
    // watches no more until the next capture.
    bool graphWatchIdle() const { return !graphsAlive() && !graphs_.owed.load(); }
    // How many failed graph replays the worker reported to the control plane.
    uint64_t graphFailuresReported() const { return graphs_.failures_reported.load(); }
    // Any thread: throws DistBackendError with the first failure of a
    // collective replayed from a CUDA graph since the last check (a stale
    // membership epoch, a peer that did not signal, an abort), and clears
    // it; returns when there was none (cuda_collectives.cc).
    void checkGraphReplays();

    // ---- elastic membership (backend_elastic.cc); each throws c10::Error
    // subclasses naming the call and the control plane's reason. Blocking
    // calls must be made without the GIL.
    void joinGroup(std::chrono::milliseconds timeout);
    void activateRanks(const std::vector<int64_t>& ranks, std::chrono::milliseconds timeout);
    void deactivateRanks(const std::vector<int64_t>& ranks, std::chrono::milliseconds timeout);
    // Reports what this rank's failed ops saw since the last sync, waits for
    // the reconciliation and returns with the new view committed here; the
    // data plane switches to it before the next collective.
    void syncAfterFailure();
    std::vector<bool> peerState(const std::vector<int64_t>& ranks) const;
    int numSyncedRanks() const;
    void extendGroupSizeTo(int64_t size);
    int usableSlots() const { return usable_slots_.load(); }
    // The HCAs nearest `location` ("cuda:<n>", "cpu:<node>", "cpu"); "" gives
    // every HCA the device filter admits. Empty without RDMA.
    std::vector<std::string> preferredHca(const std::string& location = "") const;

    // Test seam (mooncake.pg._test_hold_views): the next view callback
    // waits, with the new view already committed in the member host, until
    // releaseViewsForTest() or `bound`; this is how a test issues an op
    // while the user-visible size still lags the committed view.
    void holdViewsForTest(std::chrono::milliseconds bound);
    // The mask of the callback being held, once one is (empty at the timeout).
    std::vector<int32_t> awaitHeldViewForTest(std::chrono::milliseconds timeout);
    void releaseViewsForTest();

private:
    using Task = WorkerTask;

    void bootstrap(const c10::intrusive_ptr<c10d::Store>& store);
    // backend_elastic.cc
    void startControlPlane(const std::string& group_key, const std::string& where);
    // The generation an extension process joins: the published one, unless
    // its group was destroyed (then the next one to be published).
    static Result<int64_t> liveGeneration(KVStore& kv, Deadline deadline);
    void stopControlPlane();
    void onView(const std::vector<int32_t>& mask, int group_size);
    // Worker thread only: switches the data plane to the host's latest view
    // if it is newer than the applied one.
    Status applyLatestView(Deadline deadline);
    // Any thread: has the worker switch the data plane to the host's latest
    // view (after the ops already queued) and waits for it until `deadline`.
    Status applyViewOnWorker(const char* call, Deadline deadline);
    // Worker thread only: runs `task` against the applied view, retrying it
    // when a peer turns out to be in a newer epoch.
    Status runElastic(Task& task, Deadline deadline, bool* from_core);
    // Worker thread only: evidence reporting per failure mode.
    void reportFailure(const std::vector<int>& failed, Deadline op_deadline);
    std::vector<uint32_t> slotList(const std::vector<int64_t>& ranks, const char* fn) const;
    void workerLoop();
    // Worker thread: what the worker does before it takes `next` (null: the
    // group is shutting down): kernel calls in flight are completed first
    // unless `next` may queue behind them.
    void settleBefore(const Task* next);
    void runTask(Task& task);
    // Worker thread: completes `work` as failed (runTask's and the kernel
    // pipeline's common tail); `evidence`: the failure came from the core
    // or the kernels of the applied view, so it is reported per failure mode.
    void failWork(const c10::intrusive_ptr<MooncakeWork>& work, const char* op_name,
                  std::chrono::milliseconds timeout, Deadline deadline, const Status& status,
                  const std::vector<int>& failed, bool evidence);
    void stopWorker(bool abort_pending);
    // Stops the poster and the control plane, then flushes staged P2P sends
    // (for up to flush_p2p's bound) and destroys the P2P engine and fabric.
    void releaseCore(bool flush_p2p);
    static void flushP2P(P2PEngine& p2p, int64_t flush_ms);
    // Joins `t` without the GIL; on `t` itself, lets it go instead (the
    // thread then returns as soon as ownerGone() says so).
    static void joinOrRelease(std::thread& t);
    // On one of this backend's threads: the backend was destroyed from a
    // callback on this thread, which must not touch it again.
    static bool ownerGone();

    // Issues the op on the executor of its tensors' device (`staging`: the
    // tensors, whose host stand-ins `run` uses), queues `run` on the worker
    // and returns the op's Work.
    c10::intrusive_ptr<MooncakeWork> enqueue(c10d::OpType type, const char* op_name,
                                             std::vector<at::Tensor> outputs,
                                             std::chrono::milliseconds requested_timeout,
                                             GroupSized sized, Staging staging, CoreOp run,
                                             bool kernel_call = false);
    // The executor for an op whose tensors `staging` holds (backend_executors.cc):
    // the CPU executor for host tensors (and ops without tensors), else the
    // group's CUDA executor, created on the first CUDA op; throws c10::Error
    // for a CUDA tensor on another device than the group's earlier CUDA ops.
    Executor* executorFor(const Staging& staging, const char* op);
    // ---- device collectives on CUDA tensors (cuda_collectives.cc; without
    // CUDA, mayRunKernels is false and maybeKernel returns null).
    // Whether a call of `collective` could run on the device kernels at all
    // (CUDA group, kernels path, window size, direct path for split sizes):
    // checked before a list form packs its tensors or allocates a scratch.
    bool mayRunKernels(device::CudaCollective collective) const;
    // The op's Work when the CUDA executor's route() gives `call` to the
    // kernels, else null (the entry point stages it). `async_op`: the
    // caller's opts.asyncOp; false (torch waits at once) queues the kernels
    // on the caller's current stream rather than the group's.
    c10::intrusive_ptr<MooncakeWork> maybeKernel(KernelCall call, std::chrono::milliseconds timeout,
                                                 bool async_op);
    // The calling thread, for a synchronous call maybeKernel gave to the
    // kernels (MC_PG_CUDA_CALLER_LAUNCH): launches it at once on `exec`'s
    // current stream when the worker would only launch it there itself
    // (nothing queued or running, the membership view and stream of the
    // worker's last kernel call, no failure seen since, room in flight) and
    // returns its Work, launched; null otherwise (the call is queued). The
    // worker completes the Work from the call's result slot, as its own.
    c10::intrusive_ptr<MooncakeWork> maybeLaunchOnCaller(const KernelCall& call, CudaExecutor& exec,
                                                         std::chrono::milliseconds timeout);
    // The next result slot of the group window, cleared. The worker, or a
    // caller launching while the worker runs nothing; fewer calls are in
    // flight than there are slots, so the slot's previous call was read.
    int takeResultSlot(device::GroupWindow& w);
    // Worker thread: moves the calls maybeLaunchOnCaller launched into
    // kernels_in_flight_, behind the worker's own (they were launched while
    // it ran nothing, so after every call it had queued).
    void adoptCallerLaunches();
    // Reads MC_PG_CUDA_PATH and MC_PG_CUDA_SLOT_BYTES; throws c10::Error
    // naming a bad value.
    void configureCuda();
    // Worker thread: runs `call` on the kernels against the applied view,
    // or through the host core when the view does not suit them.
    Status runKernelCall(const KernelCall& call, Deadline deadline);
    Status runOnHost(const KernelCall& call, Deadline deadline);
    // Worker thread: the group window set up for the applied view's `size`
    // members (created at the first kernel call, re-mapped per epoch).
    Status setUpDeviceWindow(int size, Deadline deadline);
    // Worker thread: offers this rank's `in` (`in_bytes`) and `out`
    // (`out_bytes`) to the applied view's `size` members through the host
    // core and maps theirs into `members` (their outputs only when
    // `peers_read_outputs`; cuda_direct.cc). False on every rank when any
    // member cannot share or map (the call then goes through the window); an
    // error when the exchange itself fails. `peer_in_bytes`, when given, has
    // every member's own input size (all_to_all with split sizes); else each
    // member's input is taken to be `in_bytes` long. When every member has
    // mapped exactly these offers before, the second exchange (the
    // agreement) is skipped (device/direct_agreement.h).
    Result<bool> shareDirectBuffers(const void* in, uint64_t in_bytes, void* out,
                                    uint64_t out_bytes, bool peers_read_outputs, int size,
                                    Deadline deadline, device::MemberBuffers* members,
                                    const std::vector<uint64_t>* peer_in_bytes = nullptr);
    // Worker thread: the direct all_to_all with split sizes (cuda_direct.cc):
    // the members' rows exchanged and planned, their buffers shared, the
    // kernel queued; false, with nothing queued, when a member's buffers
    // cannot be shared (the call then goes through the host core).
    Result<bool> directAllToAllV(const KernelCall& call, const device::DeviceGroupView& view,
                                 const void* in, void* out, device::DeviceOpResult* result,
                                 Deadline deadline);
    // Worker thread: shareDirectBuffers for `call`, of `bytes` (the larger
    // side), when the direct path is on, the call is large enough and not
    // being captured (a replay cannot run the host exchange); false
    // otherwise. Counts the calls that go direct.
    Result<bool> maybeDirect(const KernelCall& call, uint64_t bytes, const void* in,
                             uint64_t in_bytes, void* out, uint64_t out_bytes,
                             bool peers_read_outputs, int size, Deadline deadline,
                             device::MemberBuffers* members);
    // ---- kernel calls in flight (cuda_pipeline.cc; no-ops without CUDA).
    // Worker thread: completes the oldest calls whose fences have completed,
    // and for the oldest still running turns host evidence (dead peer,
    // abort, deactivation) and its deadline into the abort word. Never blocks.
    void pollKernelCalls();
    // Worker thread: completes calls in flight, oldest first, until at most
    // `keep` remain (returns early if a completion destroyed the backend).
    void finishKernelCalls(size_t keep);
    // Any thread: the worker's calls in flight and the caller's launches it
    // has not adopted yet.
    bool kernelCallsInFlight() const {
        return calls_in_flight_.load(std::memory_order_acquire) != 0;
    }
    // Worker thread: the abort word's value for what the host knows against
    // a call over `size` ranks issued in membership `epoch` (a dead peer; a
    // member a newer view took out); 0 when nothing.
    uint64_t abortReasonAgainst(int size, uint64_t epoch) const;
    // Worker thread, idle, once calls were captured in a CUDA graph: replays
    // run unseen by the host, so this turns a dead peer into the abort word
    // as pollKernelCalls does for eager calls, and reports a failed replay's
    // evidence to the control plane once, as a failed op would.
    void watchGraphReplays();
    // Worker thread, when a new view is applied: failed replays of the old
    // one are no evidence against the new one's members.
    void forgetGraphFailures();
    // The device window's epoch for a membership view's: epoch 0 would make
    // a call's first tag equal to a cleared flag.
    static uint64_t deviceEpochOf(uint64_t view_epoch) { return view_epoch + 1; }
    bool graphsAlive() const { return liveGraphCalls() != 0; }
    // Any thread: makes running kernels return (the group is aborted).
    void abortDeviceCalls();
    // After the worker stopped, before the fabric (and its engine) goes.
    void releaseDeviceWindow();

    // `peer` < 0 (recv only): from any source.
    c10::intrusive_ptr<MooncakeWork> pointToPoint(bool is_send, std::vector<at::Tensor>& tensors,
                                                  int peer, int tag);
    // The prefix of a P2P op's error text, and its Work's completion.
    std::string p2pContext(bool is_send, int peer, int tag,
                           std::chrono::milliseconds timeout) const;
    static void completeP2PWork(MooncakeWork& work, bool is_send, const Status& status, int source,
                                const std::string& context);
    // P2P on CUDA tensors over device pools (cuda_p2p.cc). The engine for
    // `tensor`, created at the group's first such op, or null: CPU tensors,
    // MC_PG_CUDA_PATH=staged, or a member not on this host (decided once,
    // alike on every rank) take the staged path.
    P2PEngine* deviceP2PFor(const at::Tensor& tensor, const char* op);
    c10::intrusive_ptr<MooncakeWork> devicePointToPoint(P2PEngine& engine, bool is_send,
                                                        const at::Tensor& tensor, int peer,
                                                        int tag);
    // Gives the device P2P engine, if any, the latest P2P membership
    // (p2p_active_/p2p_pair_epochs_) and the members' segments, under
    // cuda_p2p_.apply_mu, so views reach the engine in order.
    void applyDeviceP2PView();
    void applyDeviceP2PViewLocked(P2PEngine& engine);  // cuda_p2p_.apply_mu held
    // Bootstrap, rank 0 of the founders: publishes the group's route for
    // P2P on CUDA tensors (every founder on this host: device pools).
    void publishDeviceP2PRoute();
    // releaseCore: takes the device P2P engine out of use and flushes its
    // sends (for up to flush_ms); the caller destroys it (null when a
    // completion callback is destroying the group: a thread of its own
    // does then), then cuda_p2p_.pools.
    std::shared_ptr<P2PEngine> releaseDeviceP2P(int64_t flush_ms);
    // The P2P engine's membership, applied apart from the collectives'
    // (backend_p2p.cc). Posts go straight to the engine while its view is
    // current; otherwise they queue, in order, for the poster thread, which
    // applies the latest view and then posts them.
    using P2PPost = std::function<void(Status view)>;
    // Runs `post` now on this thread, or queues it for the poster thread
    // when others are queued, the view is stale or `on_poster_thread` (a post
    // that may block).
    void postP2P(P2PPost post, bool on_poster_thread = false);
    void posterLoop();
    void stopPoster();
    // Any thread: brings the P2P engine to the host's latest view (peers
    // connected first); monotonic, so a late caller with an older view is a
    // no-op. Holds view_mu_.
    Status applyP2PView(Deadline deadline);
    // Connects the active peers of `view` whose endpoint changed; view_mu_ held.
    Status connectPeers(const control_plane::GroupView& view, Deadline deadline);
    // Adds `work` to the open coalescing batch, if any.
    void track(const c10::intrusive_ptr<MooncakeWork>& work);
    // One Work for `works` (endCoalescing, the coalesced collectives on the
    // device kernels): its wait() returns once every op's host part is done,
    // it completes when all have, failed with the first failure's message
    // and every op's failed ranks, and it holds every op's fences.
    // `results`: what the Work returns, when not the ops' results in order.
    c10::intrusive_ptr<MooncakeWork> joinWorks(c10d::OpType type,
                                               std::vector<c10::intrusive_ptr<MooncakeWork>> works,
                                               std::vector<at::Tensor> results = {});
    // Whether a coalesced collective on `tensors` runs as one op per tensor
    // (each on the device kernels where route() takes it), joined
    // (joinWorks): CUDA tensors on a group whose path is the kernels. The
    // staged path runs the list as one host op.
    bool coalescedPerTensor(const std::vector<at::Tensor>& tensors) const;
    // The ops one per tensor issues, joined.
    template <typename IssueOne>
    c10::intrusive_ptr<c10d::Work> perTensor(c10d::OpType type, size_t count, IssueOne issue_one,
                                             std::vector<at::Tensor> results = {}) {
        std::vector<c10::intrusive_ptr<MooncakeWork>> works;
        for (size_t i = 0; i < count; ++i)
            works.push_back(c10::static_intrusive_pointer_cast<MooncakeWork>(issue_one(i)));
        return joinWorks(type, std::move(works), std::move(results));
    }
    std::string failureMessage(const char* op_name, const Status& status,
                               std::chrono::milliseconds timeout) const;

    // Torch-boundary validation; each throws c10::Error naming the op, the
    // argument, its value and what was expected.
    void checkTensor(const at::Tensor& t, const char* op, const std::string& what) const;
    // A list with one tensor per rank of the group, each like `like` (dtype,
    // element count) and each passing checkTensor.
    void checkPerRankList(const std::vector<at::Tensor>& list, const at::Tensor& like,
                          const char* op, const char* list_name) const;
    // An input and the output it is written to: both pass checkTensor (the
    // input first), then the input's dtype is checked and returned.
    DataType checkInOut(const at::Tensor& input, const at::Tensor& output, const char* op,
                        const std::string& input_what, const std::string& output_what) const;
    // A rooted call's arguments (gather, scatter): the local tensor, the root
    // and, on the root only, the per-rank list.
    struct RootedArgs {
        at::Tensor local;
        int root = 0;
        bool is_root = false;
        std::vector<at::Tensor> list;
    };
    RootedArgs checkRooted(std::vector<at::Tensor>& locals,
                           std::vector<std::vector<at::Tensor>>& lists, int64_t root_rank,
                           const char* op, const char* root_what, const char* list_name) const;
    DataType checkDtype(const at::Tensor& t, const char* op, const std::string& what) const;
    // The core's op for `op` (PREMUL_SUM: kSum over premultiplied inputs).
    ReduceOp checkReduceOp(const c10d::ReduceOp& op, DataType dtype, const char* op_name) const;
    // PREMUL_SUM: `t` multiplied by the op's factor, in place or as a new
    // tensor, on the caller's current stream; any other op: `t` itself. In
    // place only on an open group (checkOpen(op_name) first): an op refused
    // there leaves the caller's tensor as it was.
    at::Tensor premultiplied(const c10d::ReduceOp& op, const at::Tensor& t, bool in_place,
                             const char* op_name) const;
    void checkRank(int64_t rank, const char* op, const char* what) const;
    void checkSingle(const std::vector<at::Tensor>& tensors, const char* op) const;
    void checkOpen(const char* op) const;
    std::chrono::milliseconds opTimeout(std::chrono::milliseconds requested) const;

    const BackendConfig config_;
    const int max_group_size_;
    // Follows the committed membership (the creation size until elastic
    // membership lands).
    std::atomic<int> group_size_;
    at::Tensor active_ranks_;
    std::atomic<int64_t> timeout_ms_;
    // Adds the task's times to workerStats(); the worker calls it just before
    // the task's Work completes (or is launched).
    void countWorkerOp(const Task& task);
    std::atomic<uint64_t> worker_ops_{0};
    std::atomic<uint64_t> worker_queued_ns_{0};
    std::atomic<uint64_t> worker_run_ns_{0};

    std::shared_ptr<C10dStoreAdapter> store_;
    // "mooncake_pg/<generation>": the prefix of this group instance's keys.
    std::string group_key_;
    std::shared_ptr<EngineFabric> fabric_;
    // Used only on the worker thread once the worker runs. comm_ is
    // group_comm_ while this rank is active, else solo_comm_ (this rank
    // alone: what an inactive rank's collectives run as, local-only).
    std::unique_ptr<Communicator> group_comm_;
    std::shared_ptr<Fabric> solo_fabric_;
    std::unique_ptr<Communicator> solo_comm_;
    Communicator* comm_ = nullptr;
    std::unique_ptr<P2PEngine> p2p_;

    // Control plane (backend_elastic.cc).
    std::unique_ptr<control_plane::CoordinatorHost> coordinator_;
    std::unique_ptr<control_plane::MemberHost> host_;
    std::chrono::milliseconds reconcile_window_{30000};
    std::atomic<uint64_t> latest_epoch_{0};  // the host's, set by onView
    // The data plane's; written by the worker thread only, read by P2P posts.
    std::atomic<uint64_t> applied_epoch_{0};
    bool view_applied_ = false;  // worker thread
    // The group size of the applied view (worker thread): what an op's
    // buffers are checked against, since group_size_ follows the view
    // callback, which may still be pending when the worker applies a view.
    int applied_group_size_ = 0;
    struct ViewHold {
        std::mutex mu;
        std::condition_variable cv;
        bool armed = false;
        bool holding = false;
        Deadline until = Deadline::never();
        std::vector<int32_t> mask;
    } view_hold_;
    std::atomic<int> usable_slots_{0};
    mutable std::mutex evidence_mu_;  // guards the two below
    bool unsynced_failure_ = false;
    std::vector<uint8_t> unsynced_hint_;

    std::mutex queue_mu_;  // guards queue_, accepting_, abort_pending_
    std::condition_variable queue_cv_;
    std::deque<Task> queue_;
    // queue_.size(), for the idle worker to poll without queue_mu_.
    std::atomic<size_t> queued_{0};
    bool accepting_ = true;
    bool abort_pending_ = false;
    // Set under queue_mu_ when the worker takes an op, cleared (release)
    // once it has run it: maybeLaunchOnCaller runs only while it is clear.
    std::atomic<bool> worker_runs_op_{false};
    std::thread worker_;
    std::atomic<bool> closed_{false};

    // Serializes connecting peers and applying views to the P2P engine
    // (worker and poster threads).
    std::mutex view_mu_;
    std::atomic<uint64_t> p2p_epoch_{0};  // view_mu_ for writes
    bool p2p_view_set_ = false;           // view_mu_
    // The membership last given to the P2P engine, for the device P2P
    // engine (p2p_membership_mu_, a leaf lock; empty until one was given).
    std::mutex p2p_membership_mu_;
    std::vector<uint8_t> p2p_active_;
    std::vector<uint64_t> p2p_pair_epochs_;

    // P2P on CUDA tensors over device pools (cuda_p2p.cc).
    CudaP2P cuda_p2p_;

    std::mutex post_mu_;  // guards the four below
    std::condition_variable post_cv_;
    std::deque<P2PPost> posts_;
    bool posting_ = false;  // the poster is posting a batch: later posts queue
    bool poster_stop_ = false;
    // Raised by abort(): a send the poster holds until its data reaches the
    // host mirror fails instead of waiting out its deadline.
    std::atomic<bool> poster_cancel_{false};
    std::thread poster_;

    // Executors (executor.h). The CUDA one exists once a CUDA op was issued.
    CpuExecutor cpu_executor_;
    std::mutex cuda_executor_mu_;
    std::unique_ptr<Executor> cuda_executor_;
    std::atomic<Executor*> cuda_executor_ptr_{nullptr};
    c10::Device cuda_device_{c10::kCPU};  // cuda_executor_mu_

    // Device collectives (cuda_collectives.cc).
    struct GroupWindowDeleter {
        void operator()(device::GroupWindow* w) const;
    };
    device::CudaPath cuda_path_ = device::kDefaultCudaPath;
    uint64_t cuda_slot_bytes_ = device::kDefaultSlotBytes;
    std::unique_ptr<device::GroupWindow, GroupWindowDeleter> device_window_;  // worker
    // The same, for abortDeviceCalls on other threads.
    std::atomic<device::GroupWindow*> device_window_ptr_{nullptr};
    // Worker thread: whether the running task took the kernel path (then
    // its failed ranks are kernel_failed_, not the Communicator's).
    bool kernel_ran_ = false;
    std::vector<int> kernel_failed_;
    // MC_PG_CUDA_BLOCKING_WAIT=1: wait() on a kernel call blocks until its
    // kernels have finished and raises their failure; otherwise it returns
    // once they are queued (the current stream waits on them).
    bool cuda_blocking_wait_ = false;
    // MC_PG_CUDA_DIRECT: large collectives may read the members' buffers.
    bool cuda_direct_ = true;
    // Worker thread: the kernel pipeline (cuda_pipeline.cc).
    std::optional<KernelLaunch> kernel_launch_;
    std::deque<KernelInFlight> kernels_in_flight_;
    int next_result_slot_ = 0;
    // kernels_in_flight_.size() plus caller_launches_.size().
    std::atomic<size_t> calls_in_flight_{0};
    // MC_PG_CUDA_CALLER_LAUNCH, and whether the worker launched a kernel
    // call in the view the window is set up for, with no failure or host
    // evidence against a call in flight since (maybeLaunchOnCaller): set by
    // its launch, cleared when the window takes a new view or by that
    // evidence (the worker's next launch sets it again).
    bool cuda_caller_launch_ = true;
    std::atomic<bool> caller_launch_ready_{false};
    std::mutex caller_launches_mu_;  // guards caller_launches_
    std::vector<KernelInFlight> caller_launches_;
    std::atomic<uint64_t> caller_launched_{0};
    std::chrono::steady_clock::time_point next_kernel_watch_{};
    std::chrono::steady_clock::time_point next_fence_query_{};  // pollKernelCalls
    std::atomic<uint64_t> device_calls_{0};
    std::atomic<uint64_t> direct_calls_{0};
    std::atomic<uint64_t> direct_agreements_skipped_{0};
    // Worker thread: the digest of the last direct offers every member mapped.
    uint64_t direct_agreed_digest_ = 0;
    // Collectives captured in CUDA graphs and the watch over their replays.
    GraphWatch graphs_;
    // Worker thread: set once kernels outlived their deadline and the abort
    // word. They may still run and read this group's words, so every later
    // kernel call fails with it at once and the abort word stays set.
    std::string device_stuck_;

    std::mutex coalesce_mu_;  // guards coalescing_ and coalesced_
    bool coalescing_ = false;
    std::vector<c10::intrusive_ptr<MooncakeWork>> coalesced_;
};

}  // namespace mooncake::pg
