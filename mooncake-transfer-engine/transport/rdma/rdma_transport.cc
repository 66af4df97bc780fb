// The rdma transport. One worker thread owns the data path: it connects
// queue pairs (handshake.h), posts WRITE/READ work requests in chunks, polls
// the one completion queue and enforces every request's deadline. A second
// thread answers connection requests from peers. Requests never block
// submit(); the worker never throws: failures complete tasks with a Status.
// A connection that fails (error completion or deadline) moves its QP to
// ERROR, so everything still posted on it is flushed, and is replaced on the
// next request to that peer.
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/gpu_memory.h"
#include "mooncake-transfer-engine/transport/rdma/handshake.h"
#include "mooncake-transfer-engine/transport/rdma/queue_pair.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"

namespace mooncake::te {
namespace rdma {
namespace {

// From submit() to completion of one request (as MC_TCP_REQUEST_TIMEOUT_MS).
MC_ENV_INT(RdmaRequestTimeoutMs, "MC_RDMA_REQUEST_TIMEOUT_MS", 30000)
// The handshake with one peer.
MC_ENV_INT(RdmaConnectTimeoutMs, "MC_RDMA_CONNECT_TIMEOUT_MS", 10000)
// Reach same-host peers over rdma too (loopback through the HCA): for the
// self-test and for measuring the NIC path on one machine.
MC_ENV_BOOL(RdmaSameHost, "MC_RDMA_SAME_HOST", false)

constexpr uint32_t kMaxSendWr = 256;
constexpr int kCqDepth = 4096;
constexpr uint64_t kChunkBytes = 16ull << 20;

struct LocalMr {
    uint64_t length = 0;
    ibv_mr* mr = nullptr;  // nullptr: moved through host staging
    bool device = false;   // CUDA memory (staging copies with cuMemcpy)
};

struct Connection {
    std::unique_ptr<QueuePair> qp;
    uint32_t outstanding = 0;  // posted, not yet completed
    bool dead = false;
};

struct Op {
    std::shared_ptr<TransferTask> task;
    Deadline deadline = Deadline::never();
    std::shared_ptr<Connection> conn;
    uint64_t local = 0;  // where the NIC reads/writes (a staging buffer when staged)
    uint32_t lkey = 0;
    uint64_t remote = 0;
    uint32_t rkey = 0;
    uint64_t posted = 0;  // bytes posted
    uint32_t in_flight = 0;
    void* staging = nullptr;
    ibv_mr* staging_mr = nullptr;
    bool device = false;  // the source is CUDA memory
};

// Between the request's source and its staging buffer.
Status stageCopy(const Op& op, void* dst, const void* src) {
    const TransferRequest& req = op.task->request();
    if (!op.device) {
        std::memcpy(dst, src, req.length);
        return Status::OK();
    }
    return copyDeviceHost(dst, src, req.length, req.source);
}

uint64_t randomU64() {
    static std::mutex mu;
    static std::mt19937_64 gen(std::random_device{}());
    std::lock_guard<std::mutex> lock(mu);
    return gen();
}

std::string peerKey(const SegmentDesc& peer) {
    return peer.name + "|" + std::to_string(peer.pid);
}

class RdmaTransport final : public Transport {
public:
    explicit RdmaTransport(std::unique_ptr<RdmaDevice> device) : dev_(std::move(device)) {}
    ~RdmaTransport() override { shutdown(); }

    const char* name() const override { return "rdma"; }
    Status start(TransportHost* host, SegmentDesc* local) override;
    Status exportRegion(const LocalRegion& region, RegionDesc* desc) override;
    void unexportRegion(uint64_t addr) override;
    bool canReach(const SegmentDesc& peer, const RegionDesc& region) const override {
        if ((peer.host_id == localHostId() && !envRdmaSameHost()) || peer.rdma_endpoint.empty() ||
            region.rdma_export.empty())
            return false;
        // An InfiniBand HCA cannot talk to a RoCE one: such peers stay on tcp.
        auto theirs = RdmaEndpoint::parse(peer.rdma_endpoint);
        return theirs.ok() && theirs->link_layer == dev_->endpoint().link_layer;
    }
    bool copiesDeviceMemory() const override { return true; }
    void submit(const std::shared_ptr<TransferTask>& task) override;
    // tcp (always present) answers probes for every peer.
    Status probe(const SegmentDesc& peer, Deadline deadline) override {
        (void)deadline;
        return Unavailable("rdma does not probe segment " + peer.name + " itself");
    }
    void shutdown() override;

private:
    void workerLoop();
    void acceptLoop();
    // Resolves keys, staging and the connection; false after completing `op`.
    bool prepare(Op& op);
    Result<std::shared_ptr<Connection>> connect(const SegmentDesc& peer, Deadline deadline);
    void postMore(Op& op);
    void pollCompletions();
    void fail(Op& op, Status st);
    void finish(Op& op);

    std::unique_ptr<RdmaDevice> dev_;
    TransportHost* host_ = nullptr;
    ibv_cq* cq_ = nullptr;
    std::unique_ptr<Handshake> handshake_;  // the requester side, worker thread only
    QpLocal qp_local_;

    std::mutex mr_mu_;  // guards mrs_
    std::map<uint64_t, LocalMr> mrs_;

    std::mutex mu_;  // guards inbox_ and stopped_
    std::condition_variable cv_;
    std::deque<std::shared_ptr<TransferTask>> inbox_;
    bool stopped_ = false;
    std::thread worker_;
    std::thread acceptor_;

    // Worker thread only.
    std::map<std::string, std::shared_ptr<Connection>> conns_;
    std::map<uint64_t, Op> ops_;  // by wr_id
    uint64_t next_op_ = 1;
    uint32_t in_flight_ = 0;  // work requests posted on every QP: bounded by the CQ

    std::mutex accepted_mu_;  // guards accepted_
    // The acceptor's side of peers' connections, by requester; replaced when
    // the same peer connects again.
    std::map<std::string, std::unique_ptr<QueuePair>> accepted_;
};

Status RdmaTransport::start(TransportHost* host, SegmentDesc* local) {
    host_ = host;
    if (!host->store())
        return Unavailable("rdma needs the engine's metadata store for its handshake");
    const VerbsApi& api = dev_->api();
    errno = 0;
    cq_ = api.createCq(dev_->context(), kCqDepth, nullptr, nullptr, 0);
    if (!cq_)
        return verbsError("ibv_create_cq", errno ? errno : ENOMEM, dev_->endpoint().device);
    qp_local_ = qpLocalFor(*dev_);
    handshake_ = std::make_unique<Handshake>(host->store(), host->keyPrefix(), host->segmentName());
    local->rdma_endpoint = dev_->endpoint().serialize();
    worker_ = std::thread([this] { workerLoop(); });
    acceptor_ = std::thread([this] { acceptLoop(); });
    return Status::OK();
}

Status RdmaTransport::exportRegion(const LocalRegion& region, RegionDesc* desc) {
    LocalMr entry{region.length, nullptr, cudaOrdinal(region.location) >= 0};
    void* addr = reinterpret_cast<void*>(region.addr);
    if (!entry.device) {
        // Registration pins the pages; a low `ulimit -l` refuses it. The
        // region then stays off rdma (peers reach it over tcp) rather than
        // failing the registration.
        auto mr = dev_->registerHost(addr, region.length);
        if (mr.ok()) {
            entry.mr = mr.value();
        } else {
            MC_LOG(kWarn, "rdma") << "host region of " << region.length
                                  << " bytes stays off rdma (staged for our requests; peers use "
                                     "tcp): "
                                  << mr.status().toString();
        }
    } else {
        // GPUDirect: dma-buf first, then the peer-memory module (ibv_reg_mr
        // on a device pointer), else host staging for our side of requests.
        auto dmabuf = exportDmabuf(region.addr, region.length);
        Status why = dmabuf.status();
        if (dmabuf.ok()) {
            auto mr = dev_->registerDmabuf(dmabuf->fd, dmabuf->offset, region.length, region.addr);
            ::close(dmabuf->fd);
            if (mr.ok())
                entry.mr = mr.value();
            else
                why = mr.status();
        }
        if (!entry.mr) {
            auto mr = dev_->registerHost(addr, region.length);
            if (mr.ok())
                entry.mr = mr.value();
        }
        if (!entry.mr) {
            static std::once_flag logged;
            std::call_once(logged, [&] {
                MC_LOG(kWarn, "rdma") << "device memory (" << region.location
                                      << ") cannot be registered (" << why.toString()
                                      << "; no peer-memory module either): requests from it "
                                         "go through host staging and peers cannot target it";
            });
        }
    }
    if (entry.mr && region.remote_accessible)
        desc->rdma_export = RegionKey{region.addr, region.length, entry.mr->rkey}.serialize();
    std::lock_guard<std::mutex> lock(mr_mu_);
    mrs_[region.addr] = entry;
    return Status::OK();
}

void RdmaTransport::unexportRegion(uint64_t addr) {
    std::lock_guard<std::mutex> lock(mr_mu_);
    auto it = mrs_.find(addr);
    if (it == mrs_.end())
        return;
    dev_->deregister(it->second.mr);
    mrs_.erase(it);
}

void RdmaTransport::submit(const std::shared_ptr<TransferTask>& task) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!stopped_) {
            inbox_.push_back(task);
            cv_.notify_one();
            return;
        }
    }
    task->complete(Aborted("rdma transport is not running"));
}

Result<std::shared_ptr<Connection>> RdmaTransport::connect(const SegmentDesc& peer,
                                                           Deadline deadline) {
    auto it = conns_.find(peerKey(peer));
    if (it != conns_.end() && !it->second->dead)
        return it->second;
    auto conn = std::make_shared<Connection>();
    MC_ASSIGN_OR_RETURN(conn->qp, QueuePair::create(dev_->api(), dev_->pd(), cq_, kMaxSendWr,
                                                    "QP to segment " + peer.name));
    QpMessage request;
    request.nonce = randomU64();
    QpLocal local = qp_local_;
    local.sq_psn = static_cast<uint32_t>(randomU64() & 0xffffff);
    request.address = qpAddressOf(*dev_, conn->qp->qpn(), local.sq_psn);
    const Deadline cap = Deadline::afterMs(envRdmaConnectTimeoutMs());
    MC_ASSIGN_OR_RETURN(
        QpMessage reply,
        handshake_->request(peer.name, request, cap.at() < deadline.at() ? cap : deadline));
    MC_RETURN_IF_ERROR(conn->qp->connect(local, reply.address));
    MC_LOG(kDebug, "rdma") << "connected to segment " << peer.name << " (QPN " << conn->qp->qpn()
                           << " -> " << reply.address.qpn << ")";
    conns_[peerKey(peer)] = conn;
    return conn;
}

bool RdmaTransport::prepare(Op& op) {
    const TransferRequest& req = op.task->request();
    const SegmentDesc& peer = op.task->peer();
    const RegionDesc* region = peer.findRegion(req.target_offset, req.length);
    if (!region || region->rdma_export.empty()) {
        fail(op,
             OutOfRange("rdma: target is not inside an RDMA-registered region of " + peer.name));
        return false;
    }
    auto key = RegionKey::parse(region->rdma_export);
    if (!key.ok() || req.target_offset < key->raddr ||
        req.target_offset - key->raddr > key->length - req.length) {
        fail(op, PeerFailure("rdma: segment " + peer.name + " publishes a bad region key"));
        return false;
    }
    op.remote = req.target_offset;
    op.rkey = key->rkey;
    const uint64_t src = reinterpret_cast<uint64_t>(req.source);
    {
        std::lock_guard<std::mutex> lock(mr_mu_);
        // The registration starting at or below src must hold all of it.
        auto it = mrs_.upper_bound(src);
        bool inside = it != mrs_.begin();
        if (inside) {
            --it;
            inside = req.length <= it->second.length &&
                     src - it->first <= it->second.length - req.length;
        }
        if (!inside) {
            fail(op, InvalidArgument(
                         "rdma: the source is not inside a region this transport registered"));
            return false;
        }
        op.local = src;
        op.lkey = it->second.mr ? it->second.mr->lkey : 0;
        op.device = it->second.device;
        if (!it->second.mr) {
            // Host staging: a registered bounce buffer for this request.
            if (::posix_memalign(&op.staging, 4096, req.length) != 0) {
                fail(op, Unavailable("rdma: no host memory to stage " + std::to_string(req.length) +
                                     " bytes"));
                return false;
            }
        }
    }
    if (op.staging) {
        auto mr = dev_->registerHost(op.staging, req.length);
        if (!mr.ok()) {
            fail(op, mr.status().withContext("rdma host staging"));
            return false;
        }
        op.staging_mr = mr.value();
        op.local = reinterpret_cast<uint64_t>(op.staging);
        op.lkey = op.staging_mr->lkey;
        if (req.opcode == TransferOpcode::kWrite) {
            Status st = stageCopy(op, op.staging, req.source);
            if (!st.ok()) {
                fail(op, st.withContext("rdma host staging"));
                return false;
            }
        }
    }
    auto conn = connect(peer, op.deadline);
    if (!conn.ok()) {
        fail(op, conn.status().withContext("rdma connection to segment " + peer.name));
        return false;
    }
    op.conn = conn.value();
    return true;
}

void RdmaTransport::postMore(Op& op) {
    const TransferRequest& req = op.task->request();
    while (op.posted < req.length && !op.conn->dead && op.conn->outstanding < kMaxSendWr &&
           in_flight_ < static_cast<uint32_t>(kCqDepth)) {
        const uint64_t n = std::min<uint64_t>(kChunkBytes, req.length - op.posted);
        ibv_sge sge;
        sge.addr = op.local + op.posted;
        sge.length = static_cast<uint32_t>(n);
        sge.lkey = op.lkey;
        ibv_send_wr wr;
        std::memset(&wr, 0, sizeof(wr));
        wr.wr_id = reinterpret_cast<uint64_t>(&op);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = req.opcode == TransferOpcode::kWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = op.remote + op.posted;
        wr.wr.rdma.rkey = op.rkey;
        ibv_send_wr* bad = nullptr;
        const int rc = ibv_post_send(op.conn->qp->raw(), &wr, &bad);
        if (rc != 0) {
            fail(op, verbsError("ibv_post_send", rc, "segment " + op.task->peer().name));
            return;
        }
        op.posted += n;
        op.in_flight++;
        op.conn->outstanding++;
        in_flight_++;
    }
}

void RdmaTransport::fail(Op& op, Status st) {
    op.task->complete(std::move(st));
    op.posted = op.task->request().length;  // post nothing more
    if (op.conn && !op.conn->dead) {
        op.conn->dead = true;
        op.conn->qp->fail();  // flush what is still posted
    }
}

void RdmaTransport::finish(Op& op) {
    if (op.staging_mr)
        dev_->deregister(op.staging_mr);
    std::free(op.staging);
    op.staging = nullptr;
    op.staging_mr = nullptr;
}

void RdmaTransport::pollCompletions() {
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_, 32, wc);
    for (int i = 0; i < n; ++i) {
        Op& op = *reinterpret_cast<Op*>(wc[i].wr_id);
        op.in_flight--;
        op.conn->outstanding--;
        in_flight_--;
        if (wc[i].status != IBV_WC_SUCCESS) {
            fail(op, completionError(wc[i].status, dev_->api().wcStatusStr(wc[i].status),
                                     "segment " + op.task->peer().name));
            continue;
        }
        const TransferRequest& req = op.task->request();
        if (op.in_flight == 0 && op.posted == req.length && !op.task->done()) {
            Status st;
            if (op.staging && req.opcode == TransferOpcode::kRead)
                st = stageCopy(op, req.source, op.staging);
            op.task->complete(st.ok() ? st : st.withContext("rdma host staging"));
        }
    }
}

void RdmaTransport::workerLoop() {
    while (true) {
        std::deque<std::shared_ptr<TransferTask>> fresh;
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (ops_.empty() && inbox_.empty() && !stopped_)
                cv_.wait_for(lock, std::chrono::milliseconds(50));
            if (stopped_)
                break;
            fresh.swap(inbox_);
        }
        for (auto& task : fresh) {
            const uint64_t id = next_op_++;
            Op& op = ops_[id];
            op.task = std::move(task);
            op.deadline = Deadline::afterMs(envRdmaRequestTimeoutMs());
            prepare(op);
        }
        pollCompletions();
        for (auto it = ops_.begin(); it != ops_.end();) {
            Op& op = it->second;
            if (!op.task->done() && op.conn && op.conn->dead) {
                // Another request's failure took the QP down; this one's
                // remaining chunks can no longer be posted on it.
                fail(op, PeerFailure("rdma connection to segment " + op.task->peer().name +
                                     " failed while this request was in flight"));
            }
            if (!op.task->done() && op.deadline.expired()) {
                fail(op, Timeout("rdma request to segment " + op.task->peer().name +
                                 " did not complete within " +
                                 std::to_string(envRdmaRequestTimeoutMs()) + " ms"));
            }
            if (!op.task->done() && op.conn)
                postMore(op);
            if (op.task->done() && op.in_flight == 0) {
                finish(op);
                it = ops_.erase(it);
            } else {
                ++it;
            }
        }
        if (!ops_.empty())
            std::this_thread::yield();
    }
    // Shut down: fail what is pending; the QPs go with the transport.
    for (auto& [id, op] : ops_) {
        op.task->complete(Aborted("rdma transport shut down"));
        finish(op);
    }
    ops_.clear();
}

void RdmaTransport::acceptLoop() {
    Handshake inbox(host_->store(), host_->keyPrefix(), host_->segmentName());
    while (true) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopped_)
                return;
        }
        auto request = inbox.nextRequest(Deadline::afterMs(200));
        if (!request.ok()) {
            if (request.status().code() != StatusCode::kTimeout)
                MC_LOG(kWarn, "rdma")
                    << "connection request dropped: " << request.status().toString();
            continue;
        }
        QpMessage reply;
        reply.nonce = request->nonce;
        QpLocal local = qp_local_;
        local.sq_psn = static_cast<uint32_t>(randomU64() & 0xffffff);
        auto qp = QueuePair::create(dev_->api(), dev_->pd(), cq_, 1,
                                    "QP accepted from segment " + request->from);
        Status st = qp.ok() ? qp.value()->connect(local, request->address) : qp.status();
        if (st.ok()) {
            reply.address = qpAddressOf(*dev_, qp.value()->qpn(), local.sq_psn);
            std::lock_guard<std::mutex> lock(accepted_mu_);
            accepted_[request->from] = std::move(qp).value();
        } else {
            reply.error = st.toString();
        }
        Status sent = inbox.reply(request->from, reply);
        if (!sent.ok())
            MC_LOG(kWarn, "rdma") << "cannot answer segment " << request->from << ": "
                                  << sent.toString();
    }
}

void RdmaTransport::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_)
            return;
        stopped_ = true;
        for (auto& task : inbox_)
            task->complete(Aborted("rdma transport shut down"));
        inbox_.clear();
    }
    cv_.notify_all();
    if (worker_.joinable())
        worker_.join();
    if (acceptor_.joinable())
        acceptor_.join();
    conns_.clear();
    {
        std::lock_guard<std::mutex> lock(accepted_mu_);
        accepted_.clear();
    }
    {
        std::lock_guard<std::mutex> lock(mr_mu_);
        for (auto& [addr, entry] : mrs_)
            dev_->deregister(entry.mr);
        mrs_.clear();
    }
    if (cq_)
        (void)dev_->api().destroyCq(cq_);
    cq_ = nullptr;
}

}  // namespace

std::unique_ptr<Transport> makeRdmaTransport(std::unique_ptr<RdmaDevice> device) {
    return std::make_unique<RdmaTransport>(std::move(device));
}

}  // namespace rdma
}  // namespace mooncake::te
