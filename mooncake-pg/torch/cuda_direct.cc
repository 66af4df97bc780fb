// MooncakeBackend's sharing of the caller's buffers for the direct device
// collectives (all_reduce, all_gather, reduce_scatter of kDirectMinBytes and
// more; device/peer_buffers.h): per call, the members offer the
// allocations behind their input and output through the host core's
// all_gather, map each other's (once per allocation), and agree through a
// second all_gather that every member could, so all take the same path
// (skipped when every member mapped exactly these offers before:
// device/direct_agreement.h).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/all_to_all_v.h"
#include "mooncake-pg/device/direct_agreement.h"
#include "mooncake-pg/device/peer_buffers.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/cuda_executor.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg {

namespace {

// One per process, for every group: CUDA maps a peer's allocation once per
// process. Never freed, and mappings are never closed while the process
// runs: a queued kernel of any group may still read one. Allocations the
// peers free stay mapped (their memory held) until this process exits;
// past kMaxMappings no new one is made and calls take the window path.
struct ProcessBuffers {
    std::mutex mu;
    device::BufferExports exports;
    device::PeerBufferMappings peers;
};
constexpr size_t kMaxMappings = 4096;

ProcessBuffers& processBuffers() {
    static auto* buffers = new ProcessBuffers;
    return *buffers;
}

}  // namespace

Result<bool> MooncakeBackend::maybeDirect(const KernelCall& call, uint64_t bytes, const void* in,
                                          uint64_t in_bytes, void* out, uint64_t out_bytes,
                                          bool peers_read_outputs, int size, Deadline deadline,
                                          device::MemberBuffers* members) {
    if (call.captured || !cuda_direct_ || bytes < device::kDirectMinBytes)
        return false;
    auto shared = shareDirectBuffers(in, in_bytes, out, out_bytes, peers_read_outputs, size,
                                     deadline, members);
    if (!shared.ok()) {
        // A host exchange: its failure names the core's culprits.
        kernel_failed_ = comm_->lastFailure().failed_ranks;
        return shared.status();
    }
    if (shared.value())
        direct_calls_.fetch_add(1);
    return shared.value();
}

Result<bool> MooncakeBackend::shareDirectBuffers(const void* in, uint64_t in_bytes, void* out,
                                                 uint64_t out_bytes, bool peers_read_outputs,
                                                 int size, Deadline deadline,
                                                 device::MemberBuffers* members,
                                                 const std::vector<uint64_t>* peer_in_bytes) {
    ProcessBuffers& pb = processBuffers();
    device::DirectOffer mine;
    {
        std::lock_guard<std::mutex> lock(pb.mu);
        MC_ASSIGN_OR_RETURN(mine.in, pb.exports.describe(in, in_bytes));
        MC_ASSIGN_OR_RETURN(mine.out, pb.exports.describe(out, out_bytes));
    }
    mine.in_bytes = in_bytes;
    mine.out_bytes = out_bytes;
    mine.peers_read_outputs = peers_read_outputs ? 1 : 0;
    mine.inputs_bounded_by_owner = peer_in_bytes ? 1 : 0;
    mine.epoch = applied_epoch_.load();
    mine.agreed_digest = direct_agreed_digest_;
    std::vector<device::DirectOffer> offers(static_cast<size_t>(size));
    MC_RETURN_IF_ERROR(
        comm_->allGather(&mine, offers.data(), sizeof(device::DirectOffer), deadline));
    for (const device::DirectOffer& o : offers) {
        if (o.in.allocation_id == 0 || o.out.allocation_id == 0)
            return false;  // every member sees the same offers
    }
    const uint64_t digest = device::directOffersDigest(offers);
    // Every member mapped exactly these before: each finds them mapped.
    const bool agreed = device::directAgreementCarriesOver(offers, digest);
    uint8_t mapped = 1;
    {
        std::lock_guard<std::mutex> lock(pb.mu);
        for (int p = 0; p < size && mapped; ++p) {
            if (p == config_.rank) {
                members->inputs[p] = in;
                members->outputs[p] = out;
                continue;
            }
            if (!agreed && pb.peers.size() + 2 > kMaxMappings) {
                mapped = 0;
                break;
            }
            const std::string peer = EngineFabric::segmentOf(fabric_->peerEndpoint(p));
            auto peer_in =
                pb.peers.map(peer, offers[p].in, peer_in_bytes ? (*peer_in_bytes)[p] : in_bytes);
            Result<char*> peer_out = static_cast<char*>(nullptr);
            if (!peer_in.ok())
                peer_out = peer_in;
            else if (peers_read_outputs)
                peer_out = pb.peers.map(peer, offers[p].out, out_bytes);
            if (!peer_out.ok()) {
                MC_LOG(kWarn, "pg")
                    << "rank " << config_.rank << ": the direct path cannot map rank " << p
                    << "'s buffers" << (agreed ? "" : ", taking the window path") << ": "
                    << peer_out.status().toString();
                mapped = 0;
                break;
            }
            members->inputs[p] = peer_in.value();
            members->outputs[p] = peer_out.value();
        }
    }
    if (agreed) {
        // Cannot happen short of a digest collision: the mappings are cached
        // and never closed, and the digest covers every bound they were
        // checked against. The others go direct and wait for this rank on
        // the device until the op's deadline; this rank fails at once.
        if (!mapped)
            return Internal("rank " + std::to_string(config_.rank) +
                            ": a buffer every member had mapped could not be found again (the "
                            "other ranks' calls time out waiting for this one)");
        direct_agreements_skipped_.fetch_add(1);
        return true;
    }
    std::vector<uint8_t> everyone(static_cast<size_t>(size));
    MC_RETURN_IF_ERROR(comm_->allGather(&mapped, everyone.data(), 1, deadline));
    for (uint8_t ok : everyone) {
        if (!ok) {
            direct_agreed_digest_ = 0;
            return false;
        }
    }
    direct_agreed_digest_ = digest;
    return true;
}

Result<bool> MooncakeBackend::directAllToAllV(const KernelCall& call,
                                              const device::DeviceGroupView& view, const void* in,
                                              void* out, device::DeviceOpResult* result,
                                              Deadline deadline) {
    const int size = view.size;
    // Every rank sees every row: a mismatch fails all of them with one text.
    const std::vector<uint64_t> mine = device::rowWords(call.splits);
    std::vector<uint64_t> words(mine.size() * static_cast<size_t>(size));
    Status exchanged =
        comm_->allGather(mine.data(), words.data(), mine.size() * sizeof(uint64_t), deadline);
    if (!exchanged.ok()) {
        kernel_failed_ = comm_->lastFailure().failed_ranks;
        return exchanged;
    }
    std::vector<device::AllToAllVRow> rows;
    std::vector<uint64_t> input_bytes;
    for (int p = 0; p < size; ++p) {
        MC_ASSIGN_OR_RETURN(device::AllToAllVRow row,
                            device::rowFromWords(words.data() + p * mine.size(), size));
        input_bytes.push_back(row.input_bytes);
        rows.push_back(std::move(row));
    }
    device::AllToAllVPlan plan;
    MC_RETURN_IF_ERROR(device::planAllToAllV(rows, config_.rank, &plan));
    // The members read this rank's input while it writes its output: with
    // the two overlapping it offers nothing, and every rank takes the host.
    const uint64_t in_bytes = call.splits.input_bytes, out_bytes = call.splits.output_bytes;
    const bool overlap = device::rangesOverlap(in, in_bytes, out, out_bytes);
    device::MemberBuffers members;
    auto shared = shareDirectBuffers(overlap ? nullptr : in, in_bytes, out, out_bytes, false, size,
                                     deadline, &members, &input_bytes);
    if (!shared.ok()) {
        kernel_failed_ = comm_->lastFailure().failed_ranks;
        return shared.status();
    }
    if (!shared.value())
        return false;
    direct_calls_.fetch_add(1);
    auto* exec = static_cast<CudaExecutor*>(cuda_executor_ptr_.load(std::memory_order_acquire));
    constexpr uint64_t seq = 0;  // the call counter numbers it (GroupWindow::nextCall)
    MC_RETURN_IF_ERROR(
        device::directAllToAllV(view, members, plan, in_bytes, out_bytes, seq, result,
                                c10::cuda::getCurrentCUDAStream(exec->device().index()).stream()));
    return true;
}

}  // namespace mooncake::pg
