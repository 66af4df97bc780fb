// Adapts the c10d Store that torch hands a backend (a PrefixStore unique to
// the group, usually over a TCPStore) to the KVStore interface the transfer
// engine and EngineFabric bootstrap through, so the PG needs no rendezvous
// service of its own.
#pragma once

#include <atomic>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {

// Thread-safe as far as the wrapped store is (TCPStore and PrefixStore are);
// the transfer engine calls it from its own threads. Never throws: c10d
// exceptions become Status codes.
class C10dStoreAdapter final : public KVStore {
public:
    explicit C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store);

    // An adapter over a connection of our own (store->clone()), falling back
    // to `store` itself for stores that cannot clone. A TCPStore client runs
    // one request at a time, and torch and user code hold it for the whole
    // of a blocking get/wait: our background threads (Coordinator, member
    // host, engine) sharing that client would wait behind such a call, e.g.
    // rank 0's gloo rendezvous in new_group, which waits for peers that are
    // themselves waiting for the Coordinator's reply: a deadlock until the
    // store timeout.
    static std::shared_ptr<C10dStoreAdapter> ownConnection(
        const c10::intrusive_ptr<c10d::Store>& store);

    Status set(const std::string& key, const std::string& value) override;
    // store->wait bounded by the deadline, then store->get.
    Result<std::string> get(const std::string& key, Deadline deadline) override;
    Result<int64_t> add(const std::string& key, int64_t delta) override;
    Status remove(const std::string& key) override;
    // c10d queues (TCPStore, PrefixStore); kUnavailable on stores without.
    Status queuePush(const std::string& key, const std::string& value) override;
    // Polls queueLen with a growing back-off: c10d's blocking pop can only
    // wait for the store-wide timeout, not for a per-call deadline.
    Result<std::string> queuePop(const std::string& key, Deadline deadline) override;

    // From now on remove() succeeds without touching the store (shutdown).
    void skipRemoves() { skip_removes_.store(true); }

private:
    c10::intrusive_ptr<c10d::Store> store_;
    std::atomic<bool> skip_removes_{false};
};

}  // namespace mooncake::pg
