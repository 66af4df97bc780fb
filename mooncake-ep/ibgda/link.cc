#include "mooncake-ep/ibgda/link.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>

namespace mooncake::ep {
namespace {

Status cudaFailed(const char* what, cudaError_t err) {
    (void)cudaGetLastError();
    return Internal(std::string("IBGDA link: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

Result<std::unique_ptr<IbgdaLink>> IbgdaLink::create(const IbgdaEndpointOptions& o) {
    if (!o.buffer || o.bytes == 0)
        return InvalidArgument("IBGDA link: no EP buffer");
    std::unique_ptr<IbgdaLink> self(new IbgdaLink());
    // The endpoint first: where no NIC is, its probe's reason is the answer.
    MC_ASSIGN_OR_RETURN(self->endpoint_, IbgdaEndpoint::create(o));
    self->staging_on_device_ = o.buffer_on_device;
    const auto bytes = static_cast<size_t>(ibgdaStagingBytesFor(static_cast<int64_t>(o.bytes)));
    const cudaError_t err = o.buffer_on_device
                                ? cudaMalloc(&self->staging_, bytes)
                                : cudaHostAlloc(&self->staging_, bytes, cudaHostAllocMapped);
    if (err != cudaSuccess) {
        self->staging_ = nullptr;
        return cudaFailed(
            ("allocating " + std::to_string(bytes) + " bytes of send staging").c_str(), err);
    }
    // The shadows of the signal words start at 0, as the peers' buffers do.
    if (o.buffer_on_device) {
        const cudaError_t set = cudaMemset(self->staging_, 0, bytes);
        if (set != cudaSuccess)
            return cudaFailed("zeroing the send staging", set);
        const cudaError_t sync = cudaDeviceSynchronize();
        if (sync != cudaSuccess)
            return cudaFailed("zeroing the send staging", sync);
    } else {
        std::memset(self->staging_, 0, bytes);
    }
    MC_RETURN_IF_ERROR(self->endpoint_->registerStaging(self->staging_, bytes));
    self->device_.staging = static_cast<char*>(self->staging_);
    self->device_.staging_bytes = bytes;
    self->device_.staging_lkey = self->endpoint_->stagingKey();
    self->device_.qps_per_rank = o.qps_per_rank;
    return self;
}

Status IbgdaLink::activate() {
    if (active())
        return InvalidArgument("IBGDA link: already active");
    IbgdaEndpoint& e = *endpoint_;
    if (!e.connected())
        return InvalidArgument("IBGDA link: activate() before the endpoint's connect()");
    const IbgdaEndpointOptions& o = e.options();
    const int n = o.num_ranks, qps = o.qps_per_rank;
    std::vector<IbgdaChannel> channels(static_cast<size_t>(n * qps));
    std::vector<uint64_t> bases(static_cast<size_t>(n));
    std::vector<uint32_t> keys(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
        bases[p] = p == o.rank ? reinterpret_cast<uint64_t>(o.buffer) : e.remoteAddress(p);
        keys[p] = p == o.rank ? 0 : e.remoteKey(p);
        if (p == o.rank)
            continue;  // never posted to: the rank writes its own buffer directly
        for (int q = 0; q < qps; ++q) {
            auto mapped = IbgdaDeviceQueues::map(e.queuePair(p, q));
            if (!mapped.ok())
                return mapped.status().withContext("IBGDA link: QP " + std::to_string(q) +
                                                   " towards rank " + std::to_string(p));
            IbgdaChannel& ch = channels[static_cast<size_t>(p * qps + q)];
            ch.sq = mapped.value()->sendQueue();
            ch.cq = mapped.value()->completionQueue();
            if (ch.sq.wqe_count < kIbgdaMinChannelWqes ||
                !mlx5q::completionQueueFits(ch.sq.wqe_count, ch.cq.cqe_count))
                return Internal("IBGDA link: QP towards rank " + std::to_string(p) + " has " +
                                std::to_string(ch.sq.wqe_count) + " WQEs and " +
                                std::to_string(ch.cq.cqe_count) + " CQEs; expected at least " +
                                std::to_string(kIbgdaMinChannelWqes) +
                                " WQEs and as many CQEs as WQEs");
            ch.rung = ch.sq.producer;
            ch.last_signaled = ch.sq.producer;
            queues_.push_back(std::move(mapped).value());
        }
    }
    const size_t channel_bytes = channels.size() * sizeof(IbgdaChannel);
    const size_t base_bytes = bases.size() * sizeof(uint64_t);
    const size_t key_bytes = keys.size() * sizeof(uint32_t);
    void* tables = nullptr;
    cudaError_t err = cudaMalloc(&tables, channel_bytes + base_bytes + key_bytes);
    if (err != cudaSuccess)
        return cudaFailed("allocating the device tables", err);
    char* t = static_cast<char*>(tables);
    const struct {
        void* dst;
        const void* src;
        size_t bytes;
    } copies[] = {{t, channels.data(), channel_bytes},
                  {t + channel_bytes, bases.data(), base_bytes},
                  {t + channel_bytes + base_bytes, keys.data(), key_bytes}};
    for (const auto& c : copies) {
        err = cudaMemcpy(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice);
        if (err != cudaSuccess) {
            (void)cudaFree(tables);
            return cudaFailed("uploading the device tables", err);
        }
    }
    tables_ = tables;
    device_.channels = reinterpret_cast<IbgdaChannel*>(t);
    device_.remote_bases = reinterpret_cast<const uint64_t*>(t + channel_bytes);
    device_.rkeys = reinterpret_cast<const uint32_t*>(t + channel_bytes + base_bytes);
    return Status::OK();
}

IbgdaLink::~IbgdaLink() {
    if (tables_)
        (void)cudaFree(tables_);
    queues_.clear();    // unmapped before the endpoint destroys the queues
    endpoint_.reset();  // deregisters the staging before it is freed
    if (staging_)
        (void)(staging_on_device_ ? cudaFree(staging_) : cudaFreeHost(staging_));
}

}  // namespace mooncake::ep
