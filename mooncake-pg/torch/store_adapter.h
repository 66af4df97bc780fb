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
    // check, then store->wait or polling (see the .cc), then store->get.
    Result<std::string> get(const std::string& key, Deadline deadline) override;
    Result<int64_t> add(const std::string& key, int64_t delta) override;
    Status remove(const std::string& key) override;

    // Calls each of set/get/add/check/wait/deleteKey once on keys under
    // `scratch`: the control plane needs exactly those. A store that lacks
    // one fails here, at init, naming it (kInvalidArgument), instead of
    // every control message failing later and init timing out.
    Status checkRequiredCalls(const std::string& scratch);

    // From now on remove() succeeds without touching the store (shutdown).
    void skipRemoves() { skip_removes_.store(true); }

private:
    // Maps an exception the store threw to a Status; once the store's
    // server is unreachable (DistNetworkError: a TCPStore whose host exited;
    // its client never reconnects) later calls fail at once without touching
    // it, so background threads do not make torch log each failed attempt.
    Status failed(const std::string& what_we_did);
    Status goneStatus(const std::string& what_we_did) const;

    c10::intrusive_ptr<c10d::Store> store_;
    std::atomic<bool> skip_removes_{false};
    std::atomic<bool> gone_{false};
};

}  // namespace mooncake::pg
