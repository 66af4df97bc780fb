#include "mooncake-transfer-engine/transport/rdma/handshake.h"

namespace mooncake::te::rdma {

namespace {
// How long one store read waits before the acceptor re-checks for an
// abandoned slot and its own deadline.
constexpr int64_t kSlotPollMs = 100;
}  // namespace

std::string Handshake::inboxCounterKey(const std::string& segment) const {
    return prefix_ + "/rdma/" + segment + "/inbox/n";
}

std::string Handshake::inboxSlotKey(const std::string& segment, int64_t slot) const {
    return prefix_ + "/rdma/" + segment + "/inbox/" + std::to_string(slot);
}

std::string Handshake::replyKey(const std::string& requester, uint64_t nonce) const {
    return prefix_ + "/rdma/" + requester + "/reply/" + std::to_string(nonce);
}

Result<QpMessage> Handshake::request(const std::string& peer, const QpMessage& request,
                                     Deadline deadline) {
    QpMessage out = request;
    out.kind = QpMessage::kRequest;
    out.from = self_;
    MC_ASSIGN_OR_RETURN(int64_t slot, store_->add(inboxCounterKey(peer), 1));
    MC_RETURN_IF_ERROR(store_->set(inboxSlotKey(peer, slot), out.serialize())
                           .withContext("rdma handshake with " + peer));
    const std::string key = replyKey(self_, out.nonce);
    auto bytes = store_->get(key, deadline);
    if (!bytes.ok()) {
        return bytes.status().withContext("rdma handshake: segment " + peer +
                                          " did not answer the connection request");
    }
    (void)store_->remove(key);
    MC_ASSIGN_OR_RETURN(QpMessage reply, QpMessage::parse(bytes.value()));
    if (reply.kind != QpMessage::kReply || reply.nonce != out.nonce || reply.from != peer)
        return PeerFailure("rdma handshake: segment " + peer + " answered for another request");
    if (!reply.error.empty())
        return PeerFailure("rdma handshake: segment " + peer + " refused: " + reply.error);
    return reply;
}

Result<QpMessage> Handshake::nextRequest(Deadline deadline) {
    while (true) {
        Deadline poll = Deadline::afterMs(kSlotPollMs);
        if (deadline.at() < poll.at())
            poll = deadline;
        const std::string key = inboxSlotKey(self_, next_slot_);
        auto bytes = store_->get(key, poll);
        if (bytes.ok()) {
            (void)store_->remove(key);
            ++next_slot_;
            waiting_on_empty_ = false;
            auto parsed = QpMessage::parse(bytes.value());
            if (!parsed.ok())
                return parsed.status().withContext("rdma inbox slot " +
                                                   std::to_string(next_slot_ - 1));
            if (parsed->kind != QpMessage::kRequest)
                return InvalidArgument("rdma inbox slot " + std::to_string(next_slot_ - 1) +
                                       " holds a reply, expected a request");
            return parsed;
        }
        if (bytes.status().code() != StatusCode::kTimeout)
            return bytes.status();
        // Reserved but still empty: wait for the writer, then give up on it.
        MC_ASSIGN_OR_RETURN(int64_t reserved, store_->add(inboxCounterKey(self_), 0));
        if (reserved >= next_slot_) {
            const auto now = Deadline::Clock::now();
            if (!waiting_on_empty_) {
                waiting_on_empty_ = true;
                empty_since_ = now;
            } else if (now - empty_since_ >= std::chrono::milliseconds(abandon_after_ms_)) {
                ++next_slot_;
                waiting_on_empty_ = false;
                continue;
            }
        }
        if (deadline.expired())
            return Timeout("no rdma connection request before the deadline");
    }
}

Status Handshake::reply(const std::string& requester, const QpMessage& reply) {
    QpMessage out = reply;
    out.kind = QpMessage::kReply;
    out.from = self_;
    return store_->set(replyKey(requester, out.nonce), out.serialize());
}

}  // namespace mooncake::te::rdma
