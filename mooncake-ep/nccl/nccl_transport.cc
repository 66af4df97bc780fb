#include "mooncake-ep/nccl/nccl_transport.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "mooncake-ep/nccl/nccl_device_args.h"

namespace mooncake::ep {
namespace {

std::string ncclText(ncclResult_t r) {
    return std::string(ncclGetErrorString(r)) + " (ncclResult_t " + std::to_string(r) + ")";
}

Status ncclStatus(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess)
        return Status::OK();
    return Internal("Mooncake EP NCCL transport: " + what + " failed: " + ncclText(r));
}

Status cudaStatus(cudaError_t e, const std::string& what) {
    if (e == cudaSuccess)
        return Status::OK();
    return Internal("Mooncake EP NCCL transport: " + what + ": " + cudaGetErrorString(e));
}

}  // namespace

int ncclEpBuiltVersion() {
    return NCCL_VERSION_CODE;
}

int ncclEpRuntimeVersion() {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

Status ncclEpUniqueId(std::array<char, kNcclUniqueIdBytes>* out) {
    static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");
    ncclUniqueId id;
    MC_RETURN_IF_ERROR(ncclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    std::memcpy(out->data(), &id, kNcclUniqueIdBytes);
    return Status::OK();
}

int64_t ncclEpWindowBytes(int num_ranks, int num_experts, int max_tokens, int hidden) {
    const EpLayout L{num_ranks, num_experts, max_tokens, hidden};
    // Staging: every dispatch message and every combine row this rank may
    // send in one operation (the size of one half without its signals).
    const int64_t staging = L.dispatchRegionBytes() + L.combineRegionBytes();
    return L.totalBytes() + staging;
}

struct NcclEpTransport::Impl {
    ncclComm_t comm = nullptr;
    void* memory = nullptr;
    NcclEpDevice dev{};
    bool dev_comm = false;
    void** peers = nullptr;  // device [num_ranks]
    int64_t window_bytes = 0;
    bool destroyed = false;

    // Waits for a non-blocking communicator call within the deadline.
    Status settle(std::chrono::steady_clock::time_point deadline, const std::string& what) {
        for (;;) {
            ncclResult_t state = ncclSuccess;
            MC_RETURN_IF_ERROR(ncclStatus(ncclCommGetAsyncError(comm, &state), what));
            if (state == ncclSuccess)
                return Status::OK();
            if (state != ncclInProgress)
                return ncclStatus(state, what);
            if (std::chrono::steady_clock::now() >= deadline)
                return Timeout("Mooncake EP NCCL transport: " + what +
                               " did not complete within the setup timeout (a peer "
                               "did not join?)");
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    }

    // A call on the non-blocking communicator: started (ncclInProgress) or
    // done, then settled within the deadline.
    Status call(ncclResult_t r, std::chrono::steady_clock::time_point deadline,
                const std::string& what) {
        if (r != ncclSuccess && r != ncclInProgress)
            return ncclStatus(r, what);
        return settle(deadline, what);
    }

    // Local teardown: the communicator is aborted, not finalized (no peer
    // needs to take part), the rest is freed.
    void abortLocal() {
        if (peers)
            (void)cudaFree(peers);
        peers = nullptr;
        if (dev.last_sent)
            (void)cudaFree(dev.last_sent);
        dev.last_sent = nullptr;
        if (comm)
            (void)ncclCommAbort(comm);
        comm = nullptr;
        if (memory)
            (void)ncclMemFree(memory);
        memory = nullptr;
        dev_comm = false;
        dev.window = nullptr;
    }
};

NcclEpTransport::NcclEpTransport(const NcclEpOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {}

NcclEpTransport::~NcclEpTransport() {
    if (impl_ && !impl_->destroyed) {
        (void)cudaSetDevice(options_.device);  // the frees below act on the current device
        impl_->abortLocal();
    }
}

Status NcclEpTransport::create(const NcclEpOptions& o, std::unique_ptr<NcclEpTransport>* out) {
    if (o.num_ranks < 1 || o.rank < 0 || o.rank >= o.num_ranks)
        return InvalidArgument("rank " + std::to_string(o.rank) + " of " +
                               std::to_string(o.num_ranks) + ", expected 0 <= rank < num_ranks");
    if (o.num_experts < 1 || o.num_experts % o.num_ranks != 0 || o.max_tokens < 1 ||
        o.hidden < kEpHiddenAlign || o.hidden % kEpHiddenAlign != 0)
        return InvalidArgument("num_experts " + std::to_string(o.num_experts) + ", max_tokens " +
                               std::to_string(o.max_tokens) + ", hidden " +
                               std::to_string(o.hidden) +
                               ": expected num_experts a positive multiple of num_ranks, "
                               "max_tokens >= 1, hidden a positive multiple of 128");
    std::unique_ptr<NcclEpTransport> t(new NcclEpTransport(o));
    Impl& m = *t->impl_;
    MC_RETURN_IF_ERROR(cudaStatus(cudaSetDevice(o.device), "cudaSetDevice"));
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(o.timeout_ms);

    ncclUniqueId id;
    std::memcpy(&id, o.unique_id.data(), kNcclUniqueIdBytes);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every step below is bounded by the deadline
    Status st = m.call(ncclCommInitRankConfig(&m.comm, o.num_ranks, id, o.rank, &config), deadline,
                       "ncclCommInitRankConfig");

    m.window_bytes = ncclEpWindowBytes(o.num_ranks, o.num_experts, o.max_tokens, o.hidden);
    if (st.ok())
        st = m.call(ncclMemAlloc(&m.memory, static_cast<size_t>(m.window_bytes)), deadline,
                    "ncclMemAlloc of " + std::to_string(m.window_bytes) + " bytes");
    // Sequence numbers and signals start at zero before any peer writes here
    // (the registration below is collective: no peer passes it earlier).
    if (st.ok())
        st = cudaStatus(cudaMemset(m.memory, 0, static_cast<size_t>(m.window_bytes)),
                        "zeroing the window");
    if (st.ok())
        st = cudaStatus(cudaDeviceSynchronize(), "zeroing the window");
    if (st.ok())
        st = m.call(ncclCommWindowRegister(m.comm, m.memory, static_cast<size_t>(m.window_bytes),
                                           &m.dev.window, NCCL_WIN_COLL_SYMMETRIC),
                    deadline, "ncclCommWindowRegister");

    if (st.ok()) {
        ncclDevCommRequirements reqs;
        std::memset(&reqs, 0, sizeof(reqs));
        // GIN only when some peer lies outside this rank's LSA (NVLink) team:
        // the kernels reach LSA peers by loads and stores, and NCCL 2.28
        // turns GIN on as soon as signals are asked for, which then needs a
        // GIN-capable NIC that a single NVLink node may not have. Every rank
        // of a group decides alike: one node, or every rank has off-node peers.
        const bool need_gin = ncclTeamLsa(m.comm).nRanks < o.num_ranks;
        reqs.ginForceEnable = need_gin;
        reqs.ginContextCount = need_gin ? 4 : 0;
        reqs.ginSignalCount = need_gin ? ncclEpSignalCount(o.num_ranks, o.num_experts) : 0;
        st = m.call(ncclDevCommCreate(m.comm, &reqs, &m.dev.comm), deadline, "ncclDevCommCreate");
        m.dev_comm = st.ok();
    }
    if (st.ok()) {
        const EpLayout L{o.num_ranks, o.num_experts, o.max_tokens, o.hidden};
        m.dev.staging_offset = L.totalBytes();
        const size_t sent_bytes = 2 * sizeof(uint64_t) * static_cast<size_t>(o.num_experts);
        void* sent = nullptr;
        st = cudaStatus(cudaMalloc(&sent, sent_bytes), "cudaMalloc of the signal bookkeeping");
        m.dev.last_sent = static_cast<uint64_t*>(sent);
        if (st.ok())
            st = cudaStatus(cudaMemset(sent, 0, sent_bytes), "zeroing the signal bookkeeping");
    }
    if (st.ok()) {
        void* peers = nullptr;
        st = cudaStatus(cudaMalloc(&peers, sizeof(void*) * static_cast<size_t>(o.num_ranks)),
                        "cudaMalloc of the peer table");
        m.peers = static_cast<void**>(peers);
        if (st.ok())
            st = launchNcclPeerTable(m.dev, o.num_ranks, m.peers, nullptr);
        if (st.ok())
            st = cudaStatus(cudaDeviceSynchronize(), "building the peer table");
    }
    if (!st.ok()) {
        m.abortLocal();
        m.destroyed = true;
        return st;
    }
    *out = std::move(t);
    return Status::OK();
}

Status NcclEpTransport::destroy() {
    Impl& m = *impl_;
    if (m.destroyed)
        return Status::OK();
    m.destroyed = true;
    // The window's device, whichever is current (the garbage collector may
    // run this, or the caller may have switched devices).
    Status st = cudaStatus(cudaSetDevice(options_.device), "cudaSetDevice");
    // Our kernels may still run on the window.
    if (st.ok())
        st = cudaStatus(cudaDeviceSynchronize(), "waiting for the last EP kernels");
    if (m.peers)
        (void)cudaFree(m.peers);
    m.peers = nullptr;
    if (m.dev.last_sent)
        (void)cudaFree(m.dev.last_sent);
    m.dev.last_sent = nullptr;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    if (m.dev_comm) {
        Status s = m.call(ncclDevCommDestroy(m.comm, &m.dev.comm), deadline, "ncclDevCommDestroy");
        st = st.ok() ? s : st;
    }
    m.dev_comm = false;
    if (m.dev.window) {
        Status s = m.call(ncclCommWindowDeregister(m.comm, m.dev.window), deadline,
                          "ncclCommWindowDeregister");
        st = st.ok() ? s : st;
    }
    m.dev.window = nullptr;
    if (m.comm) {
        Status s = m.call(ncclCommFinalize(m.comm), deadline, "ncclCommFinalize");
        if (s.ok()) {
            s = ncclStatus(ncclCommDestroy(m.comm), "ncclCommDestroy");
        } else {
            (void)ncclCommAbort(m.comm);  // a peer that never finalizes must not hang us
        }
        m.comm = nullptr;
        st = st.ok() ? s : st;
    }
    if (m.memory) {
        Status s = ncclStatus(ncclMemFree(m.memory), "ncclMemFree");
        st = st.ok() ? s : st;
    }
    m.memory = nullptr;
    return st;
}

EpGroupArgs NcclEpTransport::groupArgs(int32_t* active_ranks, int64_t timeout_ns) const {
    EpGroupArgs g;
    g.rank = options_.rank;
    g.num_ranks = options_.num_ranks;
    g.num_experts = options_.num_experts;
    g.max_tokens = options_.max_tokens;
    g.hidden = options_.hidden;
    g.local_buffer = impl_->memory;
    g.local_buffer_bytes = static_cast<uint64_t>(impl_->dev.staging_offset);
    g.peer_buffers = impl_->peers;
    g.active_ranks = active_ranks;
    g.timeout_ns = timeout_ns;
    return g;
}

int NcclEpTransport::lsaSize() const {
    return impl_->dev_comm ? impl_->dev.comm.lsaSize : 0;
}

Status NcclEpTransport::launchDispatch(const EpGroupArgs& g, const DispatchArgs& a,
                                       cudaStream_t stream) {
    if (impl_->destroyed)
        return Aborted("Mooncake EP NCCL transport: dispatch after destroy()");
    return launchNcclDispatch(impl_->dev, g, a, stream);
}

Status NcclEpTransport::launchCombine(const EpGroupArgs& g, const CombineArgs& a,
                                      cudaStream_t stream) {
    if (impl_->destroyed)
        return Aborted("Mooncake EP NCCL transport: combine after destroy()");
    return launchNcclCombine(impl_->dev, g, a, stream);
}

}  // namespace mooncake::ep
