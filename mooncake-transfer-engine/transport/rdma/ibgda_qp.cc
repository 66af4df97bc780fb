#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mooncake::te::rdma {
namespace {

bool powerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The provider's doorbell register takes one 8-byte store; its BlueFlame
// buffer is `bf.size` bytes (a GPU maps at least one page of it).
constexpr uint32_t kMinDoorbellMapBytes = 8;

}  // namespace

Result<Mlx5DirectApi> Mlx5DirectApi::load(const std::string& library) {
    const char* env = std::getenv("MC_RDMA_MLX5_LIBRARY");
    const std::string name =
        !library.empty() ? library : (env && *env ? std::string(env) : "libmlx5.so.1");
    void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept for the process
    if (!lib) {
        const char* why = ::dlerror();
        return Unavailable("the mlx5 direct-verbs library is missing (" +
                           std::string(why ? why : name) + ")");
    }
    Mlx5DirectApi api;
    api.isSupported =
        reinterpret_cast<decltype(api.isSupported)>(::dlsym(lib, "mlx5dv_is_supported"));
    api.initObject = reinterpret_cast<decltype(api.initObject)>(::dlsym(lib, "mlx5dv_init_obj"));
    if (!api.isSupported || !api.initObject)
        return Unavailable(name + " lacks mlx5dv_is_supported or mlx5dv_init_obj (rdma-core too old?)");
    return api;
}

Result<std::unique_ptr<IbgdaQueuePair>> IbgdaQueuePair::create(RdmaDevice& device,
                                                               const Mlx5DirectApi& dv,
                                                               uint32_t wqes) {
    if (!powerOfTwo(wqes) || wqes > mlx5::kMaxSendQueueWqes) {
        return InvalidArgument("IBGDA send queue of " + std::to_string(wqes) +
                               " WQEs: expected a power of two in 1.." +
                               std::to_string(mlx5::kMaxSendQueueWqes));
    }
    const VerbsApi& api = device.api();
    errno = 0;
    ibv_cq* cq = api.createCq(device.context(), static_cast<int>(wqes), nullptr, nullptr, 0);
    if (!cq)
        return verbsError("ibv_create_cq", errno ? errno : ENOMEM, "IBGDA completion queue");
    std::unique_ptr<IbgdaQueuePair> self(new IbgdaQueuePair(api, cq));
    MC_ASSIGN_OR_RETURN(self->qp_,
                        QueuePair::create(api, device.pd(), cq, wqes, "IBGDA queue pair"));

    mlx5dv_qp qp_out;
    mlx5dv_cq cq_out;
    std::memset(&qp_out, 0, sizeof(qp_out));
    std::memset(&cq_out, 0, sizeof(cq_out));
    mlx5dv_obj obj;
    std::memset(&obj, 0, sizeof(obj));
    obj.qp.in = self->qp_->raw();
    obj.qp.out = &qp_out;
    obj.cq.in = cq;
    obj.cq.out = &cq_out;
    const int rc = dv.initObject(&obj, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ);
    if (rc != 0)
        return verbsError("mlx5dv_init_obj", rc, "locating the IBGDA queues");
    // What the kernels assume about the queues, checked once here.
    if (qp_out.sq.stride != mlx5::kBasicBlockBytes || !powerOfTwo(qp_out.sq.wqe_cnt) ||
        qp_out.sq.wqe_cnt < wqes || qp_out.sq.wqe_cnt > mlx5::kMaxSendQueueWqes) {
        return Internal("the provider's send queue has " + std::to_string(qp_out.sq.wqe_cnt) +
                        " WQEs of " + std::to_string(qp_out.sq.stride) +
                        " bytes; IBGDA needs a power of two >= " + std::to_string(wqes) +
                        " of " + std::to_string(mlx5::kBasicBlockBytes));
    }
    if (cq_out.cqe_size != mlx5::kCqeBytes || !powerOfTwo(cq_out.cqe_cnt) ||
        !mlx5::completionQueueFits(qp_out.sq.wqe_cnt, cq_out.cqe_cnt)) {
        return Internal("the provider's CQ has " + std::to_string(cq_out.cqe_cnt) + " CQEs of " +
                        std::to_string(cq_out.cqe_size) + " bytes for a send queue of " +
                        std::to_string(qp_out.sq.wqe_cnt) + " WQEs; IBGDA needs 64-byte CQEs, "
                        "a power of two, at least as many as WQEs");
    }
    if (!qp_out.dbrec || !qp_out.sq.buf || !qp_out.bf.reg || !cq_out.buf || !cq_out.dbrec)
        return Internal("mlx5dv_init_obj left a queue address empty");
    mlx5::SendQueue& sq = self->sq_;
    sq.wqes = static_cast<unsigned char*>(qp_out.sq.buf);
    sq.wqe_count = qp_out.sq.wqe_cnt;
    sq.dbrec = reinterpret_cast<volatile uint32_t*>(qp_out.dbrec);
    sq.doorbell = static_cast<volatile uint64_t*>(qp_out.bf.reg);
    sq.qpn = self->qp_->qpn();
    mlx5::CompletionQueue& c = self->cq_;
    c.cqes = static_cast<const unsigned char*>(cq_out.buf);
    c.cqe_count = cq_out.cqe_cnt;
    c.dbrec = reinterpret_cast<volatile uint32_t*>(cq_out.dbrec);
    self->doorbell_bytes_ = qp_out.bf.size > kMinDoorbellMapBytes ? qp_out.bf.size
                                                                  : kMinDoorbellMapBytes;
    return self;
}

IbgdaQueuePair::~IbgdaQueuePair() {
    qp_.reset();  // before its CQ
    if (cq_raw_)
        (void)api_.destroyCq(cq_raw_);
}

std::vector<IbgdaQueuePair::Range> IbgdaQueuePair::ranges() const {
    return {
        {sq_.wqes, size_t{sq_.wqe_count} * mlx5::kBasicBlockBytes, false},
        {const_cast<uint32_t*>(sq_.dbrec), 2 * sizeof(uint32_t), false},
        {const_cast<unsigned char*>(cq_.cqes), size_t{cq_.cqe_count} * mlx5::kCqeBytes, false},
        {const_cast<uint32_t*>(cq_.dbrec), sizeof(uint32_t), false},
        {const_cast<uint64_t*>(sq_.doorbell), doorbell_bytes_, true},
    };
}

}  // namespace mooncake::te::rdma
