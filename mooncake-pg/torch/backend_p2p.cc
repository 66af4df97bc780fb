// MooncakeBackend's point-to-point ops (send/recv on the P2P engine) and
// coalescing (batch_isend_irecv, _coalescing_manager).
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/torch/backend.h"

namespace mooncake::pg {
// ---------------------------------------------------------------------------
// Coalescing: batch_isend_irecv and _coalescing_manager.

void MooncakeBackend::track(const c10::intrusive_ptr<MooncakeWork>& work) {
    std::lock_guard<std::mutex> lock(coalesce_mu_);
    if (coalescing_)
        coalesced_.push_back(work);
}

void MooncakeBackend::startCoalescing() {
    std::lock_guard<std::mutex> lock(coalesce_mu_);
    TORCH_CHECK(!coalescing_, "Mooncake PG: startCoalescing on group '", config_.group_name,
                "' while a coalescing batch is already open; call endCoalescing first");
    coalescing_ = true;
    coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::endCoalescing() {
    std::vector<c10::intrusive_ptr<MooncakeWork>> works;
    {
        std::lock_guard<std::mutex> lock(coalesce_mu_);
        TORCH_CHECK(coalescing_, "Mooncake PG: endCoalescing on group '", config_.group_name,
                    "' without a matching startCoalescing");
        coalescing_ = false;
        works.swap(coalesced_);
    }
    std::vector<at::Tensor> outputs;
    for (auto& w : works) {
        for (auto& t : w->result())
            outputs.push_back(t);
    }
    auto batch = c10::make_intrusive<MooncakeWork>(rank_, c10d::OpType::COALESCED,
                                                   std::move(outputs), max_group_size_);
    if (works.empty()) {
        batch->markSucceeded();
        return batch;
    }
    struct Join {
        std::mutex mu;
        size_t left = 0;
        std::string error;
        std::vector<int> failed;
    };
    auto join = std::make_shared<Join>();
    join->left = works.size();
    for (auto& w : works) {
        w->onCompletion([batch, join](MooncakeWork& done) {
            std::string error;
            std::vector<int> failed;
            {
                std::lock_guard<std::mutex> lock(join->mu);
                if (!done.isSuccess() && join->error.empty())
                    join->error = done.errorMessage();
                for (int r : done.failedRanks())
                    join->failed.push_back(r);
                if (--join->left > 0)
                    return;
                error = join->error;
                failed = join->failed;
            }
            if (error.empty()) {
                batch->markSucceeded();
            } else {
                batch->markFailed(error, failed);
            }
        });
    }
    return batch;
}

// ---------------------------------------------------------------------------
// Point-to-point.

c10::intrusive_ptr<c10d::Work> MooncakeBackend::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                     int tag) {
    return pointToPoint(/*is_send=*/true, tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                     int tag) {
    return pointToPoint(/*is_send=*/false, tensors, src_rank, tag);
}

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::pointToPoint(bool is_send,
                                                               std::vector<at::Tensor>& tensors,
                                                               int peer, int tag) {
    const char* op = is_send ? "send" : "recv";
    checkOpen(op);
    checkSingle(tensors, op);
    checkRank(peer, op, is_send ? "dst" : "src");
    TORCH_CHECK(peer != config_.rank, "Mooncake PG: ", op, " with peer ", peer,
                ", which is this rank; send/recv to self is not supported");
    const at::Tensor user = tensors[0];
    checkTensor(user, op, "tensor");
    checkDtype(user, op, "tensor");
    // The engine reads a send buffer until the data is staged and writes a
    // recv buffer until completion; a contiguous stand-in is kept alive by
    // the completion callback.
    at::Tensor buffer = user;
    if (!user.is_contiguous()) {
        buffer = is_send ? user.contiguous() : at::empty_like(user, at::MemoryFormat::Contiguous);
    }
    auto work =
        c10::make_intrusive<MooncakeWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                          std::vector<at::Tensor>{user}, max_group_size_);
    const std::string context = "Mooncake PG: " + std::string(op) + (is_send ? " to" : " from") +
                                " rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                                ") on rank " + std::to_string(config_.rank) + " of group '" +
                                config_.group_name + "' failed: ";
    auto done = [work, user, buffer, context, is_send, peer](Status status) {
        if (status.ok() && !is_send && !buffer.is_same(user)) {
            try {
                at::NoGradGuard no_grad;
                user.copy_(buffer);
            } catch (const std::exception& e) {
                status = Internal(std::string("copying into the recv tensor: ") + e.what());
            }
        }
        if (status.ok()) {
            work->markSucceeded();
            return;
        }
        std::vector<int> failed;
        if (status.code() == StatusCode::kTimeout || status.code() == StatusCode::kPeerFailure) {
            failed.push_back(peer);
        }
        std::string text = context + status.toString();
        if (status.code() == StatusCode::kInvalidArgument) {
            text += " (the send and recv sizes mismatch)";
        }
        work->markFailed(text, failed);
    };
    const Deadline deadline = Deadline::after(opTimeout(c10d::kUnsetTimeout));
    const size_t bytes = static_cast<size_t>(buffer.numel()) * buffer.element_size();
    // A view committed since the data plane last switched (a join, say) is
    // applied first, so P2P with a rank get_active_ranks already shows as
    // active works. It waits for the worker's queue, only right after a view
    // change.
    Status posted = Status::OK();
    if (host_ && latest_epoch_.load() != applied_epoch_.load())
        posted = applyViewOnWorker(op, deadline);
    if (posted.ok())
        posted = is_send ? p2p_->send(buffer.data_ptr(), bytes, peer, tag, deadline, done)
                         : p2p_->recv(buffer.data_ptr(), bytes, peer, tag, deadline, done);
    // A refused post never calls `done`.
    if (!posted.ok())
        work->markFailed(context + posted.toString(), {});
    track(work);
    return work;
}

}  // namespace mooncake::pg
