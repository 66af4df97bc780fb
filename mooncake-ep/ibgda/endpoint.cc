#include "mooncake-ep/ibgda/endpoint.h"

#include <unistd.h>

#include <cstring>

#include "mooncake-transfer-engine/transport/rdma/gpu_memory.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_config.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

namespace mooncake::ep {

Result<std::unique_ptr<IbgdaEndpoint>> IbgdaEndpoint::create(const IbgdaEndpointOptions& o) {
    if (o.num_ranks < 1 || o.rank < 0 || o.rank >= o.num_ranks)
        return InvalidArgument("IBGDA endpoint: rank " + std::to_string(o.rank) + " of " +
                               std::to_string(o.num_ranks) + " ranks");
    if (o.qps_per_rank < 1 || o.qps_per_rank > te::rdma::kMaxActiveQpsPerRank)
        return InvalidArgument("IBGDA endpoint: qps_per_rank=" + std::to_string(o.qps_per_rank) +
                               "; expected 1.." + std::to_string(te::rdma::kMaxActiveQpsPerRank));
    if (!o.buffer || o.bytes == 0)
        return InvalidArgument("IBGDA endpoint: no buffer to register");
    std::unique_ptr<IbgdaEndpoint> self(new IbgdaEndpoint(o));
    // The device the probe picks: mlx5, ACTIVE port, admitted by the filter.
    MC_ASSIGN_OR_RETURN(self->device_, te::rdma::openIbgdaDevice(te::RdmaOptions{
                                           o.device_filter, o.verbs_library, o.mlx5_library}));
    MC_ASSIGN_OR_RETURN(auto dv, te::rdma::Mlx5DirectApi::load(o.mlx5_library));
    MC_ASSIGN_OR_RETURN(self->mr_, self->registerRegion(o.buffer, o.bytes));
    self->qps_.resize(static_cast<size_t>(o.num_ranks * o.qps_per_rank));
    for (int p = 0; p < o.num_ranks; ++p) {
        if (p == o.rank)
            continue;
        for (int q = 0; q < o.qps_per_rank; ++q) {
            MC_ASSIGN_OR_RETURN(
                self->qps_[static_cast<size_t>(p * o.qps_per_rank + q)],
                te::rdma::IbgdaQueuePair::create(*self->device_, dv, o.wqes_per_qp));
        }
    }
    return self;
}

Result<ibv_mr*> IbgdaEndpoint::registerRegion(void* addr, size_t bytes) const {
    if (!options_.buffer_on_device)
        return device_->registerHost(addr, bytes);
    const auto iova = reinterpret_cast<uint64_t>(addr);
    MC_ASSIGN_OR_RETURN(const te::rdma::DmabufRange range, te::rdma::exportDmabuf(iova, bytes));
    auto mr = device_->registerDmabuf(range.fd, range.offset, bytes, iova);
    ::close(range.fd);
    return mr;
}

Status IbgdaEndpoint::registerStaging(void* addr, size_t bytes) {
    if (staging_mr_)
        return InvalidArgument("IBGDA endpoint: the staging is registered already");
    auto mr = registerRegion(addr, bytes);
    if (!mr.ok())
        return mr.status().withContext("registering the IBGDA send staging");
    staging_mr_ = mr.value();
    return Status::OK();
}

IbgdaEndpoint::~IbgdaEndpoint() {
    qps_.clear();
    if (staging_mr_)
        device_->deregister(staging_mr_);
    if (mr_)
        device_->deregister(mr_);
}

IbgdaEndpoint::Words2 IbgdaEndpoint::regionWords() const {
    return {static_cast<int64_t>(reinterpret_cast<uint64_t>(options_.buffer)),
            static_cast<int64_t>(mr_->rkey)};
}

std::vector<int64_t> IbgdaEndpoint::qpWordsFor(int peer) const {
    std::vector<int64_t> words;
    if (peer == options_.rank)
        return words;
    const uint64_t lid = device_->endpoint().lid;
    for (int q = 0; q < options_.qps_per_rank; ++q) {
        const uint64_t qpn = qps_[static_cast<size_t>(peer * options_.qps_per_rank + q)]->qpn();
        words.push_back(static_cast<int64_t>((qpn & 0xffffffu) | lid << 32));
    }
    return words;
}

IbgdaEndpoint::Words2 IbgdaEndpoint::gidWords() const {
    Words2 w{};
    std::memcpy(w.data(), device_->endpoint().gid, sizeof(w));  // prefix, interface id
    return w;
}

Status IbgdaEndpoint::connect(const std::vector<Words2>& regions,
                              const std::vector<std::vector<int64_t>>& qps_from,
                              const std::vector<Words2>& gids) {
    const auto n = static_cast<size_t>(options_.num_ranks);
    if (regions.size() != n || qps_from.size() != n || gids.size() != n) {
        return InvalidArgument("IBGDA connect: got " + std::to_string(regions.size()) + " regions, " +
                               std::to_string(qps_from.size()) + " QP lists and " +
                               std::to_string(gids.size()) + " GIDs; expected one each per rank (" +
                               std::to_string(n) + ")");
    }
    const te::rdma::RdmaEndpoint& e = device_->endpoint();
    const te::rdma::QpLocal local = te::rdma::qpLocalFor(*device_);
    for (int p = 0; p < options_.num_ranks; ++p) {
        if (p == options_.rank)
            continue;
        const std::vector<int64_t>& words = qps_from[static_cast<size_t>(p)];
        if (static_cast<int>(words.size()) != options_.qps_per_rank) {
            return InvalidArgument("IBGDA connect: rank " + std::to_string(p) + " sent " +
                                   std::to_string(words.size()) + " QPs for this rank; expected " +
                                   std::to_string(options_.qps_per_rank) +
                                   " (MOONCAKE_EP_ACTIVE_QPS_PER_RANK must match on every rank)");
        }
        for (int q = 0; q < options_.qps_per_rank; ++q) {
            const auto w = static_cast<uint64_t>(words[static_cast<size_t>(q)]);
            te::rdma::QpAddress remote;
            std::memcpy(remote.gid, gids[static_cast<size_t>(p)].data(), sizeof(remote.gid));
            remote.qpn = static_cast<uint32_t>(w & 0xffffffu);
            remote.lid = static_cast<uint16_t>(w >> 32);
            remote.mtu = e.mtu;
            Status st = queuePair(p, q).connect(local, remote);
            if (!st.ok())
                return st.withContext("IBGDA QP " + std::to_string(q) + " towards rank " +
                                      std::to_string(p));
        }
    }
    remote_ = regions;
    return Status::OK();
}

}  // namespace mooncake::ep
