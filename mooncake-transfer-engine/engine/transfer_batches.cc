// TransferEngine's batches: allocating them, checking and submitting
// requests to the transport each peer's region needs, status and waits.
#include <cstring>
#include <optional>
#include <string>

#include "mooncake-transfer-engine/engine/transfer_batch.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

// ---- transfers --------------------------------------------------------------------

Result<BatchID> TransferEngine::allocateBatchID(size_t capacity) {
    if (capacity == 0)
        return InvalidArgument("allocateBatchID: capacity is 0");
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopped_)
        return InvalidArgument("allocateBatchID before init/after shutdown");
    auto batch = std::make_shared<Batch>();
    batch->capacity = capacity;
    BatchID id = next_batch_id_++;
    batches_[id] = std::move(batch);
    return id;
}

Status TransferEngine::validate(const TransferRequest& req,
                                std::shared_ptr<const SegmentDesc>* peer, const RegionDesc** region,
                                std::optional<Deadline>* refresh_deadline) {
    if (req.length == 0)
        return InvalidArgument("request length is 0");
    if (req.opcode != TransferOpcode::kRead && req.opcode != TransferOpcode::kWrite) {
        return InvalidArgument("unknown opcode " + std::to_string(static_cast<int>(req.opcode)));
    }
    uint64_t src = reinterpret_cast<uint64_t>(req.source);
    if (!memory_.find(src, req.length)) {
        return InvalidArgument("source [" + std::to_string(src) + ", +" +
                               std::to_string(req.length) +
                               ") is not inside a locally registered region");
    }
    MC_ASSIGN_OR_RETURN(*peer, descFor(req.target_id));
    *region = (*peer)->findRegion(req.target_offset, req.length);
    if (!*region && req.target_id != kLocalSegment) {
        // The peer may have registered more memory since we opened it.
        if (!*refresh_deadline)
            *refresh_deadline = Deadline::afterMs(1000);
        MC_RETURN_IF_ERROR(refreshSegment(req.target_id, **refresh_deadline));
        MC_ASSIGN_OR_RETURN(*peer, descFor(req.target_id));
        *region = (*peer)->findRegion(req.target_offset, req.length);
    }
    if (!*region || !(*region)->remote_accessible) {
        return OutOfRange(
            "target [" + std::to_string(req.target_offset) + ", +" + std::to_string(req.length) +
            ") is not inside a remotely accessible region of segment " + (*peer)->name);
    }
    return Status::OK();
}

Status TransferEngine::submitTransfer(BatchID batch_id,
                                      const std::vector<TransferRequest>& requests) {
    std::shared_ptr<Batch> batch;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_)
            return Aborted("transfer engine shut down");
        auto it = batches_.find(batch_id);
        if (it == batches_.end())
            return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
        batch = it->second;
    }
    auto overCapacity = [&](size_t adding) -> Status {
        const size_t total = batch->count.load(std::memory_order_relaxed) + adding;
        if (total <= batch->capacity)
            return Status::OK();
        return InvalidArgument("batch " + std::to_string(batch_id) + " holds " +
                               std::to_string(batch->capacity) + " requests; " +
                               std::to_string(total) + " submitted");
    };
    // Checked again under the lock when the tasks are added: another thread
    // may submit to the batch meanwhile.
    MC_RETURN_IF_ERROR(overCapacity(requests.size()));
    // Validate all first so a bad request transfers nothing.
    struct Planned {
        std::shared_ptr<TransferTask> task;
        Transport* transport;  // nullptr: local copy
    };
    std::vector<Planned> planned;
    planned.reserve(requests.size());
    // Starts with the first refresh: reading the clock is not free.
    std::optional<Deadline> refresh;
    for (size_t i = 0; i < requests.size(); ++i) {
        std::shared_ptr<const SegmentDesc> peer;
        const RegionDesc* region = nullptr;
        Status st = validate(requests[i], &peer, &region, &refresh);
        if (!st.ok())
            return st.withContext("request " + std::to_string(i));
        Transport* t = nullptr;
        // validate() found the source registered; its location says who may copy it.
        const auto source =
            memory_.find(reinterpret_cast<uint64_t>(requests[i].source), requests[i].length);
        const bool device_source = source && cudaOrdinal(source->location) >= 0;
        if (requests[i].target_id != kLocalSegment) {
            t = select(*peer, *region);
            if (!t)
                return Unavailable("request " + std::to_string(i) + ": no transport reaches " +
                                   peer->name);
        }
        if (device_source && (!t || !t->copiesDeviceMemory())) {
            return Unavailable(
                "request " + std::to_string(i) + ": the source is device memory (" +
                source->location + ") and " +
                (t ? std::string("the ") + t->name() + " transport" : std::string("a local copy")) +
                " copies host memory only");
        }
        if (!t && cudaOrdinal(region->location) >= 0) {
            return Unavailable("request " + std::to_string(i) +
                               ": a local copy into device memory (" + region->location +
                               ") is not supported; copy on a CUDA stream instead");
        }
        planned.push_back(
            {std::make_shared<TransferTask>(requests[i], std::move(peer), batch->signal), t});
    }
    {
        std::lock_guard<std::mutex> lock(batch->mu);
        MC_RETURN_IF_ERROR(overCapacity(planned.size()));
        for (auto& p : planned)
            batch->tasks.push_back(p.task);
        batch->count.store(batch->tasks.size(), std::memory_order_relaxed);
    }
    for (auto& p : planned) {
        if (p.transport) {
            p.transport->submit(p.task);
            continue;
        }
        const TransferRequest& r = p.task->request();
        void* remote = reinterpret_cast<void*>(r.target_offset);
        if (r.opcode == TransferOpcode::kWrite)
            std::memmove(remote, r.source, r.length);
        else
            std::memmove(r.source, remote, r.length);
        p.task->complete(Status::OK());
    }
    return Status::OK();
}

Result<TransferStatus> TransferEngine::getTransferStatus(BatchID batch_id, size_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = batches_.find(batch_id);
    if (it == batches_.end())
        return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
    std::lock_guard<std::mutex> batch_lock(it->second->mu);
    if (index >= it->second->tasks.size()) {
        return InvalidArgument("request index " + std::to_string(index) + " >= submitted count " +
                               std::to_string(it->second->tasks.size()));
    }
    return it->second->tasks[index]->status();
}

Status TransferEngine::waitBatch(BatchID batch_id, Deadline deadline) {
    std::shared_ptr<Batch> batch;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = batches_.find(batch_id);
        if (it == batches_.end())
            return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
        batch = it->second;
    }
    // In index order, so the failure reported is the first one by index.
    // Tasks submitted while this waits are waited for too.
    bool more = true;
    for (size_t i = 0; more; ++i) {
        TransferTask* task = batch->at(i, &more);
        if (!task)
            break;
        if (!batch->signal->wait(*task, deadline)) {
            return Timeout("batch " + std::to_string(batch_id) +
                           " did not complete before the deadline");
        }
        TransferStatus s = task->status();
        if (s.state == TransferState::kFailed)
            return s.error;
    }
    return Status::OK();
}

Status TransferEngine::freeBatchID(BatchID batch_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = batches_.find(batch_id);
    if (it == batches_.end())
        return NotFound("batch " + std::to_string(batch_id) + " is not allocated");
    if (!it->second->allDone())
        return InvalidArgument("batch " + std::to_string(batch_id) + " still has pending requests");
    batches_.erase(it);
    return Status::OK();
}

}  // namespace mooncake::te
