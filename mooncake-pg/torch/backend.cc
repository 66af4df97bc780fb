// MooncakeBackend: bootstrap, the collective worker and the torch-boundary
// checks shared by every op. The collective entry points are in
// backend_gathers.cc, backend_reductions.cc and backend_all_to_all.cc; P2P and
// coalescing in backend_p2p.cc; membership in backend_elastic.cc.
//
// Environment knobs (read once per process):
//   MC_PG_TIMEOUT_MS      per-op deadline and bootstrap deadline of groups
//                         created without an explicit timeout= (process_group.cc).
//   MC_PG_CHUNK_BYTES     payload bytes of one collective slot (CommOptions::
//                         chunk_bytes), default 4 MiB. The collective area of
//                         each rank's window is about 2 x size x chunk.
//   MC_PG_P2P_POOL_BYTES  P2P receive pool per source peer and send pool per
//                         destination (P2POptions::pool_bytes_per_peer),
//                         default 4 MiB: about 2 x size x pool per rank.
// With the defaults each rank of a 4-rank group holds a 64 MiB window (32 MiB
// of collective slots, 32 MiB of P2P pools and rings) plus the fabric's
// 16 MiB bounce ring: 80 MiB, well under 256 MiB. Larger messages are
// chunked by the core, never staged whole.
#include "mooncake-pg/torch/backend.h"

#include <Python.h>

#include <unistd.h>

#include <algorithm>
#include <random>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/control_plane/coordinator_host.h"
#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/core/shared_engine.h"
#include "mooncake-pg/core/spin_wait.h"
#include "mooncake-pg/torch/store_adapter.h"
#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

#ifdef MC_PG_WITH_CUDA
namespace {

// Every rank of a `mooncake` group must take the same CUDA data path with the
// same window layout: a rank on the kernels and one on the host would both
// wait out every op's deadline. Each rank checks its settings against rank
// 0's when the group is created.
void checkCudaSettingsAgree(KVStore& kv, const std::string& group_key, int rank,
                            device::CudaPath path, uint64_t slot_bytes, bool direct,
                            uint64_t p2p_pool_bytes, const std::string& where,
                            std::chrono::milliseconds timeout) {
    const std::string mine = std::string(device::kCudaPathEnv) + "=" + device::cudaPathName(path) +
                             ", " + device::kCudaSlotBytesEnv + "=" + std::to_string(slot_bytes) +
                             ", " + device::kCudaDirectEnv + "=" + (direct ? "1" : "0") + ", " +
                             device::kCudaP2PPoolBytesEnv + "=" + std::to_string(p2p_pool_bytes);
    const std::string key = group_key + "/cuda_settings/";
    Status st = kv.set(key + std::to_string(rank), mine);
    TORCH_CHECK_WITH(DistBackendError, st.ok(), "Mooncake PG: bootstrapping ", where,
                     " failed: publishing its CUDA settings: ", st.toString());
    if (rank == 0)
        return;
    auto theirs = kv.get(key + "0", Deadline::after(timeout));
    TORCH_CHECK_WITH(DistBackendError, theirs.ok(), "Mooncake PG: bootstrapping ", where,
                     " failed: reading rank 0's CUDA settings: ", theirs.status().toString());
    TORCH_CHECK_VALUE(theirs.value() == mine, "Mooncake PG: ", where, " has ", mine,
                      " but rank 0 has ", theirs.value(), "; every rank must set the same ",
                      device::kCudaPathEnv, ", ", device::kCudaSlotBytesEnv, ", ",
                      device::kCudaDirectEnv, " and ", device::kCudaP2PPoolBytesEnv);
}

}  // namespace
#endif

namespace {

MC_ENV_INT(ChunkBytes, "MC_PG_CHUNK_BYTES", static_cast<int64_t>(CommOptions{}.chunk_bytes))
MC_ENV_INT(P2PPoolBytes, "MC_PG_P2P_POOL_BYTES",
           static_cast<int64_t>(P2POptions{}.pool_bytes_per_peer))

constexpr size_t kWindowAlign = 4096;
constexpr size_t kMaxP2PChunkBytes = 1 << 20;
// How long shutdown waits for staged P2P sends to reach their receivers.
constexpr int64_t kP2PFlushMs = 10000;

size_t alignUp(size_t v, size_t a) {
    return (v + a - 1) / a * a;
}

// Rank slots the group reserves; validated against the group size because a
// later join can only fill slots that were reserved up front.
int resolveMaxGroupSize(const BackendConfig& config) {
    const MooncakeBackendOptions& o = *config.options;
    int64_t max = o.max_group_size;
    if (max == 0 && o.active_ranks.has_value())
        max = o.active_ranks->numel();
    if (max == 0)
        max = config.size;
    TORCH_CHECK_VALUE(max >= config.size, "Mooncake PG: max_group_size=", max,
                      " is smaller than the size ", config.size, " of group '", config.group_name,
                      "'; reserve at least one rank slot per rank of the group");
    TORCH_CHECK_VALUE(max <= (int64_t{1} << 20), "Mooncake PG: max_group_size=", max,
                      " is implausibly large (at most 1048576 rank slots)");
    return static_cast<int>(max);
}

// Set on one of a backend's own threads (worker, P2P poster) when the
// backend was destroyed from it, i.e. its last reference went away in a
// completion callback there: the thread was let go and must return without
// touching the backend again.
thread_local bool t_owner_gone = false;

// Runs `fn` without holding the GIL: the thread it waits for may be
// completing a Future whose Python callback needs the GIL this thread holds.
template <typename Fn>
void withoutGil(Fn&& fn) {
    if (Py_IsInitialized() && PyGILState_Check()) {
        PyThreadState* state = PyEval_SaveThread();
        fn();
        PyEval_RestoreThread(state);
    } else {
        fn();
    }
}

std::string deviceText(const at::Tensor& t) {
    return t.device().str();
}

}  // namespace

std::string dtypeName(c10::ScalarType type) {
    return "torch." + c10::getDtypeNames(type).first;
}

MooncakeBackend::MooncakeBackend(const c10::intrusive_ptr<c10d::Store>& store, BackendConfig config)
    : c10d::Backend(config.rank, config.size),
      config_(std::move(config)),
      max_group_size_(resolveMaxGroupSize(config_)),
      group_size_(config_.size),
      timeout_ms_(config_.timeout.count()) {
    init();
    const auto i32 = at::TensorOptions().dtype(at::kInt);
    if (config_.options->active_ranks.has_value()) {
        active_ranks_ = *config_.options->active_ranks;
        TORCH_CHECK_VALUE(config_.is_cuda || active_ranks_.is_cpu(),
                          "Mooncake PG: active_ranks is on ", deviceText(active_ranks_),
                          "; backend 'mooncake-cpu' needs it on CPU");
        TORCH_CHECK_VALUE(active_ranks_.numel() == max_group_size_,
                          "Mooncake PG: active_ranks has ", active_ranks_.numel(),
                          " entries but the group reserves max_group_size=", max_group_size_,
                          " rank slots; size it to max_group_size");
    } else {
        active_ranks_ = at::zeros({max_group_size_}, i32);
    }
    // Founding members are active; reserved slots wait for a join. An
    // extension learns the membership from the control plane.
    active_ranks_.zero_();
    if (!config_.options->is_extension)
        active_ranks_.narrow(0, 0, config_.size).fill_(1);
    // Seed 000: every reserved slot can be activated; extend_group_size_to
    // (seed 004) only checks a size against the reservation.
    usable_slots_.store(max_group_size_);
    if (config_.is_cuda)
        configureCuda();

    bootstrap(store);
    worker_ = std::thread([this] { workerLoop(); });
    poster_ = std::thread([this] { posterLoop(); });
}

MooncakeBackend::~MooncakeBackend() {
    // Teardown may run on the backend's own threads: the worker and the P2P
    // poster are let go (joinOrRelease) after what they had queued, and the
    // P2P engine, whose progress thread cannot join itself, is destroyed on
    // a reaper thread once the callback returns (releaseCore). The GIL,
    // held when Python drops the last reference, goes for the whole
    // teardown: the threads it waits for may need it.
    withoutGil([this] { shutdown(); });
}

bool MooncakeBackend::ownerGone() {
    return t_owner_gone;
}

void MooncakeBackend::joinOrRelease(std::thread& t) {
    if (!t.joinable())
        return;
    if (t.get_id() == std::this_thread::get_id()) {
        t.detach();
        t_owner_gone = true;
        return;
    }
    withoutGil([&t] { t.join(); });
}

void MooncakeBackend::bootstrap(const c10::intrusive_ptr<c10d::Store>& store) {
    store_ = C10dStoreAdapter::ownConnection(store);
    const std::shared_ptr<KVStore> kv = store_;
    const std::string where = "rank " + std::to_string(config_.rank) + " of group '" +
                              config_.group_name + "' (" + getBackendName() + ")";
    // Keys of this process alone: two groups can reach the store under one
    // prefix (torch's size-1 subgroups of new_subgroups(group=...) did), and
    // a shared key one rank deletes while another waits on it failed init.
    std::random_device entropy;
    const std::string scratch = "mooncake_pg_store_check/" + std::to_string(config_.rank) + "/" +
                                std::to_string(::getpid()) + "-" + std::to_string(entropy());
    Status usable = store_->checkRequiredCalls(scratch);
    TORCH_CHECK_VALUE(usable.ok(), "Mooncake PG: ", where, ": ", usable.toString());
    TORCH_CHECK_VALUE(envChunkBytes() > 0, "Mooncake PG: MC_PG_CHUNK_BYTES=", envChunkBytes(),
                      " must be a positive byte count");
    TORCH_CHECK_VALUE(envP2PPoolBytes() > 0,
                      "Mooncake PG: MC_PG_P2P_POOL_BYTES=", envP2PPoolBytes(),
                      " must be a positive byte count");
    CommOptions comm_options;
    comm_options.chunk_bytes = static_cast<size_t>(envChunkBytes());
    comm_options.window_offset = 0;
    P2POptions p2p_options;
    p2p_options.pool_bytes_per_peer = static_cast<size_t>(envP2PPoolBytes());
    p2p_options.chunk_bytes = std::min(kMaxP2PChunkBytes, p2p_options.pool_bytes_per_peer);
    // Windows cover every reserved slot, so joins need no reallocation.
    const size_t comm_bytes =
        alignUp(Communicator::windowBytesFor(max_group_size_, comm_options), kWindowAlign);
    p2p_options.window_offset = comm_bytes;
    size_t window_bytes =
        comm_bytes + alignUp(P2PEngine::windowBytesFor(max_group_size_, p2p_options), kWindowAlign);
    if (config_.is_cuda) {
        // The rings of P2P on CUDA tensors (cuda_p2p.cc); its pools are in
        // device memory.
        P2POptions rings;
        rings.external_pools = true;
        cuda_p2p_.window_offset = window_bytes;
        window_bytes += alignUp(P2PEngine::windowBytesFor(max_group_size_, rings), kWindowAlign);
    }

    // torch reuses a group's store prefix when a group is destroyed and
    // created again under the same name; every founding instance counts
    // itself in, so each generation bootstraps under keys of its own. Every
    // local check comes before this, so a rank that gives up does not skew
    // the count. Extensions join the generation rank 0 published instead of
    // counting themselves in (they are not part of the founders' count).
    const bool extension = config_.options->is_extension;
    int64_t generation = 0;
    if (extension) {
        auto current = liveGeneration(*kv, Deadline::afterMs(timeout_ms_.load()));
        TORCH_CHECK_WITH(
            DistBackendError, current.ok(), "Mooncake PG: ", where,
            " (is_extension=True) found no running group to join: ", current.status().toString());
        generation = current.value();
    } else {
        auto ticket = kv->add("mooncake_pg/instances", 1);
        TORCH_CHECK_WITH(DistBackendError, ticket.ok(), "Mooncake PG: bootstrapping ", where,
                         " failed: ", ticket.status().toString());
        generation = (ticket.value() - 1) / config_.size;
    }

    EngineFabricOptions fabric_options;
    fabric_options.rank = config_.rank;
    fabric_options.size = max_group_size_;
    fabric_options.connect_ranks = extension ? 0 : config_.size;
    fabric_options.window_bytes = window_bytes;
    fabric_options.group_key = "mooncake_pg/" + std::to_string(generation);
    fabric_options.host_ip = config_.host_ip;
    fabric_options.device_filter = config_.device_filter;
    fabric_options.bootstrap_timeout_ms = timeout_ms_.load();
    if (config_.shared_engine) {
        auto engine = config_.shared_engine->lease();
        TORCH_CHECK_WITH(DistBackendError, engine.ok(), "Mooncake PG: bootstrapping ", where,
                         " failed: ", engine.status().toString());
        fabric_options.engine = std::move(engine).value();
    }
    // Peers open each other's segments through their engine's store, so the
    // ranks agree on the engine before any of them bootstraps on it.
    const Status agreed = agreeOnEngine(
        *kv, fabric_options.group_key, config_.rank, extension ? 1 : config_.size,
        engineChoice(config_.shared_engine.get()), Deadline::afterMs(timeout_ms_.load()));
    TORCH_CHECK_WITH(DistBackendError, agreed.ok(), "Mooncake PG: bootstrapping ", where,
                     " failed: ", agreed.toString());
    MC_LOG(kInfo, "pg") << where << ": bootstrapping generation " << generation << ", window "
                        << window_bytes << " bytes (collectives " << comm_bytes << ")";

    auto fabric = EngineFabric::create(kv, fabric_options);
    TORCH_CHECK_WITH(DistBackendError, fabric.ok(), "Mooncake PG: bootstrapping ", where,
                     " failed: ", fabric.status().toString());
    fabric_ = fabric.value();
    group_comm_ = std::make_unique<Communicator>(fabric_, comm_options);
    p2p_ = std::make_unique<P2PEngine>(fabric_, p2p_options);
    // Not active: collectives run local-only, this rank alone among the
    // group's slots, so per-rank blocks keep their meaning (its own block is
    // at its rank).
    CommOptions solo_options;
    solo_options.chunk_bytes = 4096;
    solo_fabric_ = std::make_shared<SoloFabric>(
        config_.rank, max_group_size_, Communicator::windowBytesFor(max_group_size_, solo_options));
    solo_comm_ = std::make_unique<Communicator>(solo_fabric_, solo_options);
    std::vector<uint8_t> only_me(static_cast<size_t>(max_group_size_), 0);
    only_me[static_cast<size_t>(config_.rank)] = 1;
    const Status solo = solo_comm_->setMembership(only_me, 0);
    TORCH_CHECK(solo.ok(), "Mooncake PG: ", where, ": ", solo.toString());
    comm_ = extension ? solo_comm_.get() : group_comm_.get();
    if (!extension && config_.rank == 0) {
        auto st = kv->set("mooncake_pg/current", std::to_string(generation));
        TORCH_CHECK_WITH(DistBackendError, st.ok(), "Mooncake PG: bootstrapping ", where,
                         " failed: ", st.toString());
    }
    group_key_ = fabric_options.group_key;
    startControlPlane(group_key_, where);
#ifdef MC_PG_WITH_CUDA
    // Last: rank 0's creation, which waits for every rank's bootstrap and
    // control plane, completes, and only the rank that differs fails.
    if (config_.is_cuda) {
        if (!extension && config_.rank == 0)
            publishDeviceP2PRoute();
        checkCudaSettingsAgree(*kv, group_key_, config_.rank, cuda_path_, cuda_slot_bytes_,
                               cuda_direct_, cuda_p2p_.pool_bytes, where, config_.timeout);
    }
#endif
}

Result<int64_t> MooncakeBackend::liveGeneration(KVStore& kv, Deadline deadline) {
    // A destroyed group of the same name leaves its generation in "current"
    // until the next founders publish theirs; joining it would wait for a
    // Coordinator that is gone. Its Coordinator marked it closed on the way
    // out (stopControlPlane), so wait for a generation that is not.
    constexpr auto kPoll = std::chrono::milliseconds(10);
    std::string last;
    while (true) {
        auto current = kv.get("mooncake_pg/current", deadline);
        if (!current.ok())
            return current.status();
        last = current.value();
        auto closed = kv.get("mooncake_pg/" + last + "/closed", Deadline::afterMs(0));
        if (!closed.ok())
            return static_cast<int64_t>(std::stoll(last));
        if (deadline.expired()) {
            return Timeout("the only published generation (" + last +
                           ") belongs to a destroyed group; no new founders published theirs");
        }
        std::this_thread::sleep_for(kPoll);
    }
}

const std::string MooncakeBackend::getBackendName() const {
    return config_.is_cuda ? "mooncake" : "mooncake-cpu";
}

c10::intrusive_ptr<c10d::Backend::Options> MooncakeBackend::getBackendOptions() {
    return config_.options;
}

void MooncakeBackend::setTimeout(std::chrono::milliseconds timeout) {
    TORCH_CHECK_VALUE(timeout.count() > 0, "Mooncake PG: timeout must be positive, got ",
                      timeout.count(), " ms");
    timeout_ms_.store(timeout.count());
    // Kept in step: getBackendOptions() reports the timeout ops run under.
    config_.options->timeout = timeout;
}

void MooncakeBackend::releaseCore(bool flush_p2p) {
    // Aborting: a post waiting for a producer the user may never finish
    // must not hold up the join below.
    if (!flush_p2p)
        poster_cancel_.store(true);
    stopPoster();
    const int64_t flush_ms = flush_p2p ? std::min<int64_t>(timeout_ms_.load(), kP2PFlushMs) : 0;
    // P2P before the fabric: its destructor fails pending sends/recvs (their
    // Works complete with kAborted) and stops its thread. Staged sends are
    // flushed before this rank leaves the membership, which would make the
    // receivers drop them.
    if (p2p_ && p2p_->onProgressThread()) {
        // Destroyed from a P2P completion callback: the engine's progress
        // thread is this one, so it can neither deliver staged sends nor be
        // joined here. A reaper does both once the callback has returned;
        // the engine keeps the fabric alive until then.
        std::thread([p2p = std::move(p2p_), flush_ms]() mutable {
            flushP2P(*p2p, flush_ms);
            p2p.reset();
        }).detach();
    } else if (p2p_) {
        flushP2P(*p2p_, flush_ms);
    }
    std::shared_ptr<P2PEngine> device_p2p = releaseDeviceP2P(flush_ms);
    stopControlPlane();
    withoutGil([this, &device_p2p] {
        p2p_.reset();
        // Its destructor waits for the copies still queued on the pools.
        device_p2p.reset();
        cuda_p2p_.pools.reset();
    });
    comm_ = nullptr;
    group_comm_.reset();
    solo_comm_.reset();
    solo_fabric_.reset();
    // Ranks leave at different times, and the rank hosting the TCPStore may
    // already be gone; withdrawing our keys then only produces store errors.
    // The keys are generation-scoped, so leaving them behind is harmless.
    if (store_)
        store_->skipRemoves();
    // The window is memory of the fabric's engine.
    releaseDeviceWindow();
    fabric_.reset();
}

void MooncakeBackend::flushP2P(P2PEngine& p2p, int64_t flush_ms) {
    if (flush_ms <= 0)
        return;
    // A completed isend is only staged; leaving now would drop it while its
    // receiver may still be about to take it.
    Status st = Status::OK();
    withoutGil([&] { st = p2p.flushSends(Deadline::afterMs(flush_ms)); });
    if (!st.ok())
        MC_LOG(kWarn, "pg") << "shutting down with undelivered P2P sends: " << st.toString();
}

void MooncakeBackend::shutdown() {
    if (closed_.exchange(true))
        return;
    stopWorker(/*abort_pending=*/false);
    releaseCore(/*flush_p2p=*/true);
}

void MooncakeBackend::abort() {
    if (closed_.exchange(true))
        return;
    stopWorker(/*abort_pending=*/true);
    releaseCore(/*flush_p2p=*/false);
}

}  // namespace mooncake::pg
