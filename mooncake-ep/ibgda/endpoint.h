// The IBGDA side of an EP Buffer's connection (seed 000's connect()): on one
// HCA, `qps_per_rank` RC queue pairs towards every other rank and the
// Buffer's memory registered, plus the words the group exchanges, in the
// seed's order:
//   all_gather  regionWords()   (raddr, rkey) of the registered buffer
//   all_to_all  qpWordsFor(p)   (QPN | LID << 32) of each QP made for peer p
//   all_gather  gidWords()      the GID's subnet prefix and interface id
// then connect() brings every QP up towards its peer's matching QP (QP q of
// rank r for peer p pairs with QP q of p for r). update_ep_member() builds a
// new endpoint, so new QPs, and exchanges again. Kernels reach the QPs
// through IbgdaDeviceQueues. Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"

namespace mooncake::ep {

struct IbgdaEndpointOptions {
    int rank = 0;
    int num_ranks = 1;
    int qps_per_rank = 8;  // MOONCAKE_EP_ACTIVE_QPS_PER_RANK
    uint32_t wqes_per_qp = 256;
    void* buffer = nullptr;  // the Buffer's memory, registered for remote access
    size_t bytes = 0;
    bool buffer_on_device = true;  // device memory (buffer and staging): through dma-buf
    std::vector<std::string> device_filter;
    std::string verbs_library;  // "" = the default (tests name the fake)
    std::string mlx5_library;
};

class IbgdaEndpoint {
public:
    using Words2 = std::array<int64_t, 2>;

    static Result<std::unique_ptr<IbgdaEndpoint>> create(const IbgdaEndpointOptions& options);
    ~IbgdaEndpoint();
    IbgdaEndpoint(const IbgdaEndpoint&) = delete;
    IbgdaEndpoint& operator=(const IbgdaEndpoint&) = delete;

    Words2 regionWords() const;
    // qps_per_rank words for peer `peer` (empty for this rank itself).
    std::vector<int64_t> qpWordsFor(int peer) const;
    Words2 gidWords() const;

    // What every rank sent: regions[p] and gids[p] from the all_gathers,
    // qps_from[p] = what rank p's qpWordsFor(this rank) was. Brings up every
    // QP; kInvalidArgument naming the rank whose words do not fit.
    Status connect(const std::vector<Words2>& regions, const std::vector<std::vector<int64_t>>& qps_from,
                   const std::vector<Words2>& gids);

    // After connect(): where rank `peer`'s buffer is and its key.
    uint64_t remoteAddress(int peer) const { return remote_[peer][0]; }
    uint32_t remoteKey(int peer) const { return static_cast<uint32_t>(remote_[peer][1]); }
    uint32_t localKey() const { return mr_->lkey; }
    // Registers local memory the NIC reads from (the kernels' send staging)
    // like the buffer; its key never leaves this rank. Once.
    Status registerStaging(void* addr, size_t bytes);
    uint32_t stagingKey() const { return staging_mr_ ? staging_mr_->lkey : 0; }
    bool connected() const { return !remote_.empty(); }
    const IbgdaEndpointOptions& options() const { return options_; }
    // QP `q` towards `peer` (host views: IbgdaDeviceQueues maps them).
    te::rdma::IbgdaQueuePair& queuePair(int peer, int q) {
        return *qps_[static_cast<size_t>(peer * options_.qps_per_rank + q)];
    }
    const std::string& deviceName() const { return device_->endpoint().device; }
    int qpsPerRank() const { return options_.qps_per_rank; }

private:
    explicit IbgdaEndpoint(const IbgdaEndpointOptions& o) : options_(o) {}

    IbgdaEndpointOptions options_;
    std::unique_ptr<te::rdma::RdmaDevice> device_;
    // Registers [addr, addr + bytes) as the options say (dma-buf or host).
    Result<ibv_mr*> registerRegion(void* addr, size_t bytes) const;

    ibv_mr* mr_ = nullptr;
    ibv_mr* staging_mr_ = nullptr;
    std::vector<std::unique_ptr<te::rdma::IbgdaQueuePair>> qps_;  // [peer][q]; none for self
    std::vector<Words2> remote_;
};

}  // namespace mooncake::ep
