// MooncakeBackend's point-to-point ops (send/recv on the P2P engine) and
// coalescing (batch_isend_irecv, _coalescing_manager).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/control_plane/member_host.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-pg/core/p2p.h"
#include "mooncake-pg/core/pair_epoch.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-transfer-engine/common/logging.h"

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
    return joinWorks(c10d::OpType::COALESCED, std::move(works));
}

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::joinWorks(
    c10d::OpType type, std::vector<c10::intrusive_ptr<MooncakeWork>> works,
    std::vector<at::Tensor> results) {
    std::vector<at::Tensor> outputs = std::move(results);
    const bool from_ops = outputs.empty();
    std::vector<c10::Device> devices;
    for (auto& w : works) {
        if (from_ops) {
            for (auto& t : w->result())
                outputs.push_back(t);
        }
        for (const auto& d : w->devices()) {
            if (std::find(devices.begin(), devices.end(), d) == devices.end())
                devices.push_back(d);
        }
    }
    auto batch = c10::make_intrusive<MooncakeWork>(rank_, type, std::move(outputs), max_group_size_,
                                                   devices);
    // The batch's wait() orders the caller's stream after every op's copies.
    for (auto& w : works) {
        for (const auto& f : w->fences())
            batch->addFence(f);
    }
    if (works.empty()) {
        batch->markSucceeded();
        return batch;
    }
    struct Join {
        std::mutex mu;
        size_t left = 0;  // ops not completed
        std::string error;
        std::vector<int> failed;
        // With kernel calls among them, the batch's host part is done once
        // every op's is (launched or completed), unless one has failed by
        // then: its wait() then raises. Without, it is done when it completes.
        size_t hosts_left = 0;  // ops whose host part is not done
        bool host_failed = false;
        bool launched = false;
    };
    auto join = std::make_shared<Join>();
    join->left = join->hosts_left = works.size();
    for (auto& w : works) {
        w->onHostPartDone([batch, join](MooncakeWork& done) {
            const bool failed = done.exception() != nullptr;
            {
                std::lock_guard<std::mutex> lock(join->mu);
                join->host_failed = join->host_failed || failed;
                join->launched = join->launched || done.launched();
                if (--join->hosts_left > 0 || join->host_failed || !join->launched)
                    return;
            }
            batch->markLaunched();
        });
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

c10::intrusive_ptr<c10d::Work> MooncakeBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
    return pointToPoint(/*is_send=*/false, tensors, /*peer=*/-1, tag);
}

c10::intrusive_ptr<MooncakeWork> MooncakeBackend::pointToPoint(bool is_send,
                                                               std::vector<at::Tensor>& tensors,
                                                               int peer, int tag) {
    const bool any_source = peer < 0;
    const char* op = is_send ? "send" : "recv";
    checkOpen(op);
    checkSingle(tensors, op);
    if (!any_source) {
        checkRank(peer, op, is_send ? "dst" : "src");
        TORCH_CHECK(peer != config_.rank, "Mooncake PG: ", op, " with peer ", peer,
                    ", which is this rank; send/recv to self is not supported");
    }
    const at::Tensor user = tensors[0];
    checkTensor(user, op, "tensor");
    checkDtype(user, op, "tensor");
    if (P2PEngine* on_device = deviceP2PFor(user, op))
        return devicePointToPoint(*on_device, is_send, user, peer, tag);
    // CUDA tensors: the engine moves host mirrors, filled (send) on the
    // group's communication stream after the caller's prior work, and copied
    // back (recv) on it after completion; the executor holds both until then.
    // A recv's mirror is not filled: the engine may write it before a copy
    // of the old values, queued behind the caller's work, would land.
    Staging st(op);
    const at::Tensor target = is_send ? st.in(user, "tensor") : st.out(user, "tensor");
    Executor* executor = executorFor(st, op);
    const std::shared_ptr<DeviceOp> device_op = executor->issue(std::move(st));
    // The engine reads a send buffer until the data is staged and writes a
    // recv buffer until completion; a contiguous stand-in is kept alive by
    // the completion callback.
    at::Tensor buffer = target;
    if (!target.is_contiguous()) {
        buffer =
            is_send ? target.contiguous() : at::empty_like(target, at::MemoryFormat::Contiguous);
    }
    const c10d::OpType type = is_send      ? c10d::OpType::SEND
                              : any_source ? c10d::OpType::RECVANYSOURCE
                                           : c10d::OpType::RECV;
    auto work = c10::make_intrusive<MooncakeWork>(rank_, type, std::vector<at::Tensor>{user},
                                                  max_group_size_, device_op->devices());
    work->addFence(device_op->fence());
    const auto timeout = opTimeout(c10d::kUnsetTimeout);
    const std::string context = p2pContext(is_send, peer, tag, timeout);
    auto done = [work, target, buffer, context, is_send, executor, device_op](Status status,
                                                                              int source) {
        if (status.ok() && !is_send && !buffer.is_same(target)) {
            try {
                at::NoGradGuard no_grad;
                target.copy_(buffer);
            } catch (const std::exception& e) {
                status = Internal(std::string("copying into the recv tensor: ") + e.what());
            }
        }
        const Status finished = executor->finish(device_op, status.ok());
        if (status.ok())
            status = finished;
        completeP2PWork(*work, is_send, status, source, context);
    };
    const Deadline deadline = Deadline::after(timeout);
    // The engine stages a send's data at post time, so a CUDA tensor's copy
    // to its host mirror must have landed by then. That copy waits for the
    // caller's prior work on its stream: if it has not landed yet, the post
    // waits for it on the poster thread, and isend returns at once instead
    // of blocking the caller until the producer kernels finish.
    bool await_inputs = false;
    if (is_send) {
        const Status staged = executor->awaitInputs(*device_op, Deadline::afterMs(0));
        if (staged.code() == StatusCode::kTimeout) {
            await_inputs = true;
        } else if (!staged.ok()) {
            (void)executor->finish(device_op, false);  // the op fails anyway
            work->markFailed(context + staged.toString(), {});
            track(work);
            return work;
        }
    }
    const size_t bytes = static_cast<size_t>(buffer.numel()) * buffer.element_size();
    void* data = buffer.data_ptr();
    P2PEngine* engine = p2p_.get();
    const std::atomic<bool>* cancel = &poster_cancel_;  // abort() ends the wait for the inputs
    // `view` is the outcome of bringing the engine to the latest view; a
    // refused post never calls `done`.
    postP2P(
        [=](Status view) {
            Status posted = view;
            if (posted.ok() && await_inputs)
                posted = executor->awaitInputs(*device_op, deadline, cancel);
            if (posted.ok()) {
                if (is_send) {
                    posted = engine->send(data, bytes, peer, tag, deadline,
                                          [done, peer](Status st) { done(std::move(st), peer); });
                } else if (any_source) {
                    posted = engine->recvAny(data, bytes, tag, deadline, done);
                } else {
                    posted = engine->recv(data, bytes, peer, tag, deadline,
                                          [done, peer](Status st) { done(std::move(st), peer); });
                }
            }
            if (!posted.ok()) {
                (void)executor->finish(device_op, false);  // the op fails anyway
                work->markFailed(context + posted.toString(), {});
            }
        },
        /*on_poster_thread=*/await_inputs);
    track(work);
    return work;
}

std::string MooncakeBackend::p2pContext(bool is_send, int peer, int tag,
                                        std::chrono::milliseconds timeout) const {
    const std::string who = peer < 0 ? std::string("any rank") : "rank " + std::to_string(peer);
    return "Mooncake PG: " + std::string(is_send ? "send to " : "recv from ") + who + " (tag " +
           std::to_string(tag) + ") on rank " + std::to_string(config_.rank) + " of group '" +
           config_.group_name + "' (" + getBackendName() + ", timeout " +
           std::to_string(timeout.count()) + " ms) failed: ";
}

void MooncakeBackend::completeP2PWork(MooncakeWork& work, bool is_send, const Status& status,
                                      int source, const std::string& context) {
    if (!is_send && source >= 0)
        work.setSourceRank(source);
    if (status.ok()) {
        work.markSucceeded();
        return;
    }
    std::vector<int> failed;
    if (source >= 0 &&
        (status.code() == StatusCode::kTimeout || status.code() == StatusCode::kPeerFailure)) {
        failed.push_back(source);
    }
    std::string text = context + status.toString();
    if (status.code() == StatusCode::kInvalidArgument) {
        text += " (the send and recv sizes mismatch)";
    }
    work.markFailed(text, failed);
}

// ---------------------------------------------------------------------------
// The P2P view and the poster thread.

void MooncakeBackend::postP2P(P2PPost post, bool on_poster_thread) {
    bool refused = false;
    {
        std::lock_guard<std::mutex> lock(post_mu_);
        // A view committed since the engine last switched (a join, say) is
        // applied first, so P2P with a rank get_active_ranks already shows
        // as active works; posts behind queued ones queue too, in order.
        const bool stale = host_ && latest_epoch_.load() != p2p_epoch_.load();
        if (on_poster_thread || stale || posting_ || !posts_.empty()) {
            if (!poster_stop_) {
                posts_.push_back(std::move(post));
                post_cv_.notify_one();
                return;
            }
            refused = true;
        }
    }
    // Outside the lock: a refused post completes its Work, whose callbacks
    // may post again.
    post(refused ? Aborted("the group was shut down") : Status::OK());
}

void MooncakeBackend::posterLoop() {
    std::unique_lock<std::mutex> lock(post_mu_);
    while (true) {
        post_cv_.wait(lock, [this] { return poster_stop_ || !posts_.empty(); });
        if (posts_.empty())
            return;  // stopping, nothing left
        std::deque<P2PPost> batch;
        batch.swap(posts_);
        posting_ = true;
        lock.unlock();
        Status view = applyP2PView(Deadline::afterMs(timeout_ms_.load()));
        if (!view.ok()) {
            view = view.withContext("applying membership epoch " +
                                    std::to_string(latest_epoch_.load()) + " to P2P");
        }
        for (size_t i = 0; i < batch.size(); ++i) {
            batch[i](view);
            if (!ownerGone())
                continue;
            // A completion callback dropped the last reference to the
            // backend, which let this thread go (stopPoster): the engine is
            // gone, so the rest are refused.
            for (size_t k = i + 1; k < batch.size(); ++k)
                batch[k](Aborted("the group was destroyed"));
            return;
        }
        lock.lock();
        posting_ = false;
    }
}

void MooncakeBackend::stopPoster() {
    {
        std::lock_guard<std::mutex> lock(post_mu_);
        poster_stop_ = true;
    }
    post_cv_.notify_all();
    joinOrRelease(poster_);
}

Status MooncakeBackend::connectPeers(const control_plane::GroupView& view, Deadline deadline) {
    for (int r = 0; r < max_group_size_; ++r) {
        if (r == config_.rank || !view.isActive(static_cast<uint32_t>(r)))
            continue;
        // Reserved slots filled after bootstrap, and replacements that came
        // back with a new segment, are (re)connected before any traffic.
        const std::string endpoint = host_->peerEndpoint(static_cast<uint32_t>(r));
        if (endpoint.empty())
            return Unavailable("rank " + std::to_string(r) +
                               " is active but published no endpoint");
        if (endpoint != fabric_->peerEndpoint(r))
            MC_RETURN_IF_ERROR(fabric_->connectPeer(r, endpoint, deadline));
    }
    return Status::OK();
}

Status MooncakeBackend::applyP2PView(Deadline deadline) {
    if (!host_)
        return Status::OK();
    std::lock_guard<std::mutex> lock(view_mu_);
    const control_plane::GroupView view = host_->view();
    if (p2p_view_set_ && view.epoch <= p2p_epoch_.load())
        return Status::OK();
    MC_RETURN_IF_ERROR(connectPeers(view, deadline));
    std::vector<uint8_t> active(static_cast<size_t>(max_group_size_), 0);
    for (int r = 0; r < max_group_size_; ++r)
        active[r] = view.isActive(static_cast<uint32_t>(r)) ? 1 : 0;
    // A pair restarts only when one of its two ranks was (re)activated
    // since, which both ranks read alike from the view whichever views in
    // between they skipped.
    std::vector<uint64_t> since;
    for (const auto& slot : view.slots)
        since.push_back(slot.active_since);
    const std::vector<uint64_t> pair_epochs = pairEpochs(static_cast<uint32_t>(config_.rank), since,
                                                         static_cast<size_t>(max_group_size_));
    Status st = p2p_->setMembership(active, pair_epochs);
    if (!st.ok())
        MC_LOG(kWarn, "pg") << "P2P membership of epoch " << view.epoch << ": " << st.toString();
    {
        std::lock_guard<std::mutex> lock(p2p_membership_mu_);
        p2p_active_ = active;
        p2p_pair_epochs_ = pair_epochs;
    }
    applyDeviceP2PView();
    p2p_epoch_.store(view.epoch);
    p2p_view_set_ = true;
    return Status::OK();
}

}  // namespace mooncake::pg
