// The connection handshake through the engine's metadata store (the c10d
// Store under torch), so RDMA needs no listener and no second rendezvous.
// Every segment has an inbox:
//   <prefix>/rdma/<segment>/inbox/n     counter; add(1) reserves a slot
//   <prefix>/rdma/<segment>/inbox/<i>   slot i >= 1: a QpMessage request
//   <prefix>/rdma/<requester>/reply/<nonce>   the answer (a QpMessage reply)
// A requester reserves a slot, writes its request and waits for the reply
// under its deadline. The acceptor reads slots in order and deletes what it
// read; a slot reserved but never written (the requester died in between) is
// skipped once it has been empty for `abandon_after_ms`.
#pragma once

#include <cstdint>
#include <string>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"

namespace mooncake::te::rdma {

class Handshake {
public:
    Handshake(KVStore* store, std::string prefix, std::string self, int64_t abandon_after_ms = 5000)
        : store_(store),
          prefix_(std::move(prefix)),
          self_(std::move(self)),
          abandon_after_ms_(abandon_after_ms) {}

    // Sends `request` (kind kRequest, from = self) to `peer` and returns its
    // reply: kTimeout when none comes before the deadline, kPeerFailure with
    // the peer's reason when it refused.
    Result<QpMessage> request(const std::string& peer, const QpMessage& request, Deadline deadline);

    // The next request in this segment's inbox; kTimeout when none arrives
    // before the deadline. A slot holding bytes that do not parse is consumed
    // and reported as kInvalidArgument (the caller logs it and goes on).
    Result<QpMessage> nextRequest(Deadline deadline);

    Status reply(const std::string& requester, const QpMessage& reply);

    std::string inboxCounterKey(const std::string& segment) const;
    std::string inboxSlotKey(const std::string& segment, int64_t slot) const;
    std::string replyKey(const std::string& requester, uint64_t nonce) const;

private:
    KVStore* store_;
    std::string prefix_;
    std::string self_;
    int64_t abandon_after_ms_;
    int64_t next_slot_ = 1;
    // When the acceptor first found next_slot_ reserved but empty.
    Deadline::Clock::time_point empty_since_{};
    bool waiting_on_empty_ = false;
};

}  // namespace mooncake::te::rdma
