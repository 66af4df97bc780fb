// A stand-in for libibverbs, so the rdma transport runs end to end on a
// machine without a NIC: tests load it through EngineOptions.verbs_library.
// It emulates HCAs and RC queue pairs inside one process, strictly:
//   - devices come from MC_FAKE_VERBS_DEVICES, e.g. "mlx5_0=down/ib,mlx5_1=active/eth"
//     (read at every ibv_get_device_list); an eth port's GID table has a
//     link-local GID at 0 and an IPv4-mapped one at 1;
//   - ibv_modify_qp accepts only the legal next state with exactly the
//     attribute mask the IB spec requires for it (EINVAL otherwise);
//   - WRITE/READ/fetch-add check the local lkey and the remote rkey against
//     the registered ranges (LOC_PROT_ERR / REM_ACCESS_ERR completions) and
//     copy with memcpy; a destroyed or errored destination QP gives
//     RETRY_EXC_ERR; a QP moved to ERROR flushes what it holds;
//   - mc_fake_verbs_devices_opened() counts ibv_open_device calls;
//   - mc_fake_verbs_stall(1) makes posted requests wait forever (a stalled
//     peer), so the caller's deadline must act;
//   - MC_FAKE_VERBS_FAIL_CREATE_CQ=1 makes ibv_create_cq fail with ENOMEM;
//   - it also stands in for the mlx5 direct-verbs library: mlx5dv_is_supported
//     says yes for devices named mlx5_*, and mlx5dv_init_obj on a QP with its
//     CQ hands out queues that a software HCA (soft_hca.h) executes when the
//     test calls mc_fake_verbs_process_direct(), or all along on a thread of
//     its own with MC_FAKE_VERBS_DIRECT_THREAD=1: IBGDA without a NIC.
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/cpp/rdma/soft_hca.h"

namespace {

struct FakeDevice {
    ibv_device dev;
    bool active = false;
    bool ethernet = false;
};

struct FakeCq {
    ibv_cq cq;
    int cqe = 0;
    std::deque<ibv_wc> entries;
};

struct FakeQp {
    ibv_qp qp;
    uint32_t dest = 0;
    uint32_t max_send_wr = 0;
    int direct = -1;  // its queues in directHca(), once mlx5dv_init_obj ran
    std::vector<ibv_send_wr> stalled;  // wr_id + flags only
};

std::mutex mu;  // guards everything below and every FakeCq/FakeQp
std::map<uint32_t, FakeQp*> qps;
std::map<uint32_t, ibv_mr*> mrs;  // by lkey (== rkey)
uint32_t next_qpn = 0x100;
uint32_t next_key = 0x1000;
bool stall = false;

int legalMask(ibv_qp_state from, ibv_qp_state to) {
    if (to == IBV_QPS_ERR)
        return IBV_QP_STATE;
    if (from == IBV_QPS_RESET && to == IBV_QPS_INIT)
        return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    if (from == IBV_QPS_INIT && to == IBV_QPS_RTR)
        return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (from == IBV_QPS_RTR && to == IBV_QPS_RTS)
        return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC;
    return -1;
}

ibv_mr* findMr(uint32_t key, uint64_t addr, uint64_t len) {
    auto it = mrs.find(key);
    if (it == mrs.end())
        return nullptr;
    const uint64_t base = reinterpret_cast<uint64_t>(it->second->addr);
    if (addr < base || len > it->second->length || addr - base > it->second->length - len)
        return nullptr;
    return it->second;
}

void complete(FakeQp* q, const ibv_send_wr& wr, ibv_wc_status status) {
    if (!(wr.send_flags & IBV_SEND_SIGNALED) && status == IBV_WC_SUCCESS)
        return;
    ibv_wc wc;
    std::memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr.wr_id;
    wc.status = status;
    wc.qp_num = q->qp.qp_num;
    reinterpret_cast<FakeCq*>(q->qp.send_cq)->entries.push_back(wc);
}

ibv_wc_status execute(FakeQp* q, const ibv_send_wr& wr) {
    auto peer = qps.find(q->dest);
    if (peer == qps.end() || peer->second->qp.state != IBV_QPS_RTS)
        return IBV_WC_RETRY_EXC_ERR;
    const ibv_sge& sge = wr.sg_list[0];
    if (!findMr(sge.lkey, sge.addr, sge.length))
        return IBV_WC_LOC_PROT_ERR;
    char* local = reinterpret_cast<char*>(sge.addr);
    if (wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        if (!findMr(wr.wr.atomic.rkey, wr.wr.atomic.remote_addr, 8) || sge.length != 8)
            return IBV_WC_REM_ACCESS_ERR;
        auto* target = reinterpret_cast<uint64_t*>(wr.wr.atomic.remote_addr);
        std::memcpy(local, target, 8);
        *target += wr.wr.atomic.compare_add;
        return IBV_WC_SUCCESS;
    }
    if (!findMr(wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, sge.length))
        return IBV_WC_REM_ACCESS_ERR;
    char* remote = reinterpret_cast<char*>(wr.wr.rdma.remote_addr);
    if (wr.opcode == IBV_WR_RDMA_WRITE)
        std::memcpy(remote, local, sge.length);
    else if (wr.opcode == IBV_WR_RDMA_READ)
        std::memcpy(local, remote, sge.length);
    else
        return IBV_WC_LOC_QP_OP_ERR;
    return IBV_WC_SUCCESS;
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
    std::lock_guard<std::mutex> lock(mu);
    auto* q = reinterpret_cast<FakeQp*>(qp);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_ERR) {
            complete(q, *wr, IBV_WC_WR_FLUSH_ERR);
            continue;
        }
        if (q->qp.state != IBV_QPS_RTS || wr->num_sge != 1) {
            *bad = wr;
            return EINVAL;
        }
        if (stall) {
            q->stalled.push_back(*wr);
            continue;
        }
        const ibv_wc_status st = execute(q, *wr);
        complete(q, *wr, st);
        if (st != IBV_WC_SUCCESS)
            q->qp.state = IBV_QPS_ERR;
    }
    return 0;
}

int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
    std::lock_guard<std::mutex> lock(mu);
    auto* c = reinterpret_cast<FakeCq*>(cq);
    int got = 0;
    while (got < n && !c->entries.empty()) {
        wc[got++] = c->entries.front();
        c->entries.pop_front();
    }
    return got;
}

std::vector<FakeDevice*> listed;

uint32_t roundUpPowerOfTwo(uint32_t v) {
    uint32_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

// Executes WQEs from the queues mlx5dv_init_obj hands out, against the same
// memory registrations and QP states as the verbs path. Never destroyed: it
// may run until the process exits.
mooncake::te::rdma::soft::SoftHca& directHca() {
    using mooncake::te::rdma::soft::SoftHca;
    static SoftHca* hca = new SoftHca(SoftHca::Hooks{
        [](uint32_t key, uint64_t addr, uint64_t bytes) {
            std::lock_guard<std::mutex> lock(mu);
            return findMr(key, addr, bytes) != nullptr;
        },
        [](uint32_t qpn) {
            std::lock_guard<std::mutex> lock(mu);
            auto self = qps.find(qpn);
            if (self == qps.end() || self->second->qp.state != IBV_QPS_RTS)
                return false;
            auto peer = qps.find(self->second->dest);
            return peer != qps.end() && peer->second->qp.state == IBV_QPS_RTS;
        }});
    return *hca;
}

std::atomic<int> devices_opened{0};

}  // namespace

extern "C" {

int mlx5dv_init_obj(mlx5dv_obj* obj, uint64_t type) {
    // Only what IBGDA asks for: a QP and its send CQ together.
    if (type != (MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ) || !obj->qp.in || !obj->cq.in ||
        obj->qp.in->send_cq != obj->cq.in)
        return EINVAL;
    auto* q = reinterpret_cast<FakeQp*>(obj->qp.in);
    auto* c = reinterpret_cast<FakeCq*>(obj->cq.in);
    uint32_t wqes = 0, cqes = 0, qpn = 0;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (q->direct >= 0)
            return EEXIST;
        wqes = roundUpPowerOfTwo(q->max_send_wr);
        cqes = roundUpPowerOfTwo(static_cast<uint32_t>(c->cqe));
        qpn = q->qp.qp_num;
    }
    // Outside `mu`: the HCA's hooks take it.
    auto& hca = directHca();
    static const bool threaded = [&hca] {
        const char* on = std::getenv("MC_FAKE_VERBS_DIRECT_THREAD");
        if (on == nullptr || std::strcmp(on, "1") != 0)
            return false;
        hca.start();  // runs until the process exits
        return true;
    }();
    (void)threaded;
    const int index = hca.createQueuePair(wqes, cqes, {}, 0, qpn);
    {
        std::lock_guard<std::mutex> lock(mu);
        q->direct = index;
    }
    const mooncake::te::rdma::mlx5::SendQueue sq = hca.sendQueue(index);
    const mooncake::te::rdma::mlx5::CompletionQueue cq = hca.completionQueue(index);
    obj->qp.out->dbrec = const_cast<__be32*>(reinterpret_cast<volatile __be32*>(sq.dbrec));
    obj->qp.out->sq.buf = sq.wqes;
    obj->qp.out->sq.wqe_cnt = sq.wqe_count;
    obj->qp.out->sq.stride = 64;
    obj->qp.out->bf.reg = const_cast<uint64_t*>(sq.doorbell);
    obj->qp.out->bf.size = 256;
    obj->cq.out->buf = const_cast<unsigned char*>(cq.cqes);
    obj->cq.out->dbrec = const_cast<__be32*>(reinterpret_cast<volatile __be32*>(cq.dbrec));
    obj->cq.out->cqe_cnt = cq.cqe_count;
    obj->cq.out->cqe_size = 64;
    obj->cq.out->cqn = qpn;
    return 0;
}

// Runs the software HCA over every direct QP once; the WQEs executed.
size_t mc_fake_verbs_process_direct() { return directHca().processAll(); }

// How many times ibv_open_device was called, ever.
int mc_fake_verbs_devices_opened() {
    return devices_opened.load();
}

void mc_fake_verbs_stall(int on) {
    std::lock_guard<std::mutex> lock(mu);
    stall = on != 0;
}

ibv_device** ibv_get_device_list(int* num) {
    const char* spec = std::getenv("MC_FAKE_VERBS_DEVICES");
    std::vector<FakeDevice*> found;
    std::string s = spec ? spec : "";
    size_t pos = 0;
    while (pos < s.size()) {
        size_t comma = s.find(',', pos);
        if (comma == std::string::npos)
            comma = s.size();
        const std::string item = s.substr(pos, comma - pos);
        const size_t eq = item.find('=');
        auto* d = new FakeDevice();
        std::strncpy(d->dev.name, item.substr(0, eq).c_str(), sizeof(d->dev.name) - 1);
        d->active = item.find("active") != std::string::npos;
        d->ethernet = item.find("/eth") != std::string::npos;
        found.push_back(d);
        pos = comma + 1;
    }
    auto** out = static_cast<ibv_device**>(std::calloc(found.size() + 1, sizeof(ibv_device*)));
    for (size_t i = 0; i < found.size(); ++i)
        out[i] = &found[i]->dev;
    if (num)
        *num = static_cast<int>(found.size());
    return out;
}

void ibv_free_device_list(ibv_device** list) {
    // The devices stay: contexts opened from them point at them.
    std::free(list);
}

bool mlx5dv_is_supported(ibv_device* device) {
    return std::strncmp(device->name, "mlx5_", 5) == 0;
}

const char* ibv_get_device_name(ibv_device* device) {
    return device->name;
}

ibv_context* ibv_open_device(ibv_device* device) {
    devices_opened.fetch_add(1);
    auto* ctx = static_cast<ibv_context*>(std::calloc(1, sizeof(ibv_context)));
    ctx->device = device;
    ctx->ops.post_send = postSend;
    ctx->ops.poll_cq = pollCq;
    ctx->abi_compat = nullptr;  // not extended: ibv_query_port below is used
    return ctx;
}

int ibv_close_device(ibv_context* ctx) {
    std::free(ctx);
    return 0;
}

int ibv_query_device(ibv_context*, ibv_device_attr* attr) {
    std::memset(attr, 0, sizeof(*attr));
    attr->phys_port_cnt = 2;
    attr->max_qp_rd_atom = 16;
    attr->max_qp_init_rd_atom = 16;
    return 0;
}

int(ibv_query_port)(ibv_context* ctx, uint8_t port, _compat_ibv_port_attr* compat) {
    auto* attr = reinterpret_cast<ibv_port_attr*>(compat);
    auto* d = reinterpret_cast<FakeDevice*>(ctx->device);
    // Port 2 is always down: port selection must skip it.
    attr->state = d->active && port == 1 ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    attr->active_mtu = IBV_MTU_4096;
    attr->gid_tbl_len = 4;
    attr->link_layer = d->ethernet ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
    attr->lid = d->ethernet ? 0 : 0x42;
    return 0;
}

int ibv_query_gid(ibv_context* ctx, uint8_t, int index, ibv_gid* gid) {
    auto* d = reinterpret_cast<FakeDevice*>(ctx->device);
    std::memset(gid, 0, sizeof(*gid));
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    if (d->ethernet && index == 1) {
        std::memset(gid, 0, sizeof(*gid));
        gid->raw[10] = gid->raw[11] = 0xff;
        gid->raw[12] = 10;
        gid->raw[15] = 1;
    }
    return index < 4 ? 0 : EINVAL;
}

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
    auto* pd = static_cast<ibv_pd*>(std::calloc(1, sizeof(ibv_pd)));
    pd->context = ctx;
    return pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
    std::free(pd);
    return 0;
}

ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, size_t length, int) {
    std::lock_guard<std::mutex> lock(mu);
    auto* mr = static_cast<ibv_mr*>(std::calloc(1, sizeof(ibv_mr)));
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = length;
    mr->lkey = mr->rkey = next_key++;
    mrs[mr->lkey] = mr;
    return mr;
}

int ibv_dereg_mr(ibv_mr* mr) {
    std::lock_guard<std::mutex> lock(mu);
    mrs.erase(mr->lkey);
    std::free(mr);
    return 0;
}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void*, ibv_comp_channel*, int) {
    // MC_FAKE_VERBS_FAIL_CREATE_CQ=1: a provider that cannot make one (out of
    // resources), so a transport fails to start.
    const char* fail = std::getenv("MC_FAKE_VERBS_FAIL_CREATE_CQ");
    if (fail != nullptr && std::strcmp(fail, "1") == 0) {
        errno = ENOMEM;
        return nullptr;
    }
    auto* c = new FakeCq();
    c->cq.context = ctx;
    c->cq.cqe = cqe;
    c->cqe = cqe;
    return &c->cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
    delete reinterpret_cast<FakeCq*>(cq);
    return 0;
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
    if (init->qp_type != IBV_QPT_RC) {
        errno = EINVAL;
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto* q = new FakeQp();
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = init->send_cq;
    q->qp.recv_cq = init->recv_cq;
    q->qp.qp_num = next_qpn++;
    q->max_send_wr = init->cap.max_send_wr;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    qps[q->qp.qp_num] = q;
    return &q->qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
    std::lock_guard<std::mutex> lock(mu);
    auto* q = reinterpret_cast<FakeQp*>(qp);
    if (legalMask(q->qp.state, attr->qp_state) != mask)
        return EINVAL;
    if (attr->qp_state == IBV_QPS_RTR) {
        // An RoCE path needs a GRH; an IB one a LID.
        if (!attr->ah_attr.is_global && attr->ah_attr.dlid == 0)
            return EINVAL;
        q->dest = attr->dest_qp_num;
    }
    if (attr->qp_state == IBV_QPS_ERR) {
        for (const ibv_send_wr& wr : q->stalled)
            complete(q, wr, IBV_WC_WR_FLUSH_ERR);
        q->stalled.clear();
    }
    q->qp.state = attr->qp_state;
    return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
    int direct = -1;
    {
        std::lock_guard<std::mutex> lock(mu);
        qps.erase(qp->qp_num);
        direct = reinterpret_cast<FakeQp*>(qp)->direct;
        delete reinterpret_cast<FakeQp*>(qp);
    }
    if (direct >= 0)
        directHca().removeQueuePair(direct);
    return 0;
}

const char* ibv_wc_status_str(ibv_wc_status status) {
    switch (status) {
        case IBV_WC_SUCCESS:
            return "success";
        case IBV_WC_LOC_PROT_ERR:
            return "local protection error";
        case IBV_WC_WR_FLUSH_ERR:
            return "Work Request Flushed Error";
        case IBV_WC_REM_ACCESS_ERR:
            return "remote access error";
        case IBV_WC_RETRY_EXC_ERR:
            return "transport retry counter exceeded";
        default:
            return "fake status";
    }
}

}  // extern "C"
