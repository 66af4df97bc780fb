// SharedEngine: one TransferEngine that the user creates and that several
// process groups of this process use instead of an engine each
// (pg.set_transfer_engine). Processes that talk to each other share one
// KVStore: segment metadata lives there, and the engine secret is agreed
// through it (the first engine creates it, the others read it), so only
// processes that can read that store can connect.
//
// Ownership: a group's fabric holds a lease, a shared_ptr to the engine that
// also keeps this object alive, so the engine outlives every group that uses
// it. close() is refused while leases are out.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {

struct SharedEngineOptions {
    std::string host_ip;  // "" = 127.0.0.1
    std::vector<std::string> device_filter;
    // Unique among the engines of the store; "" = generated.
    std::string segment_name;
    // Scopes the keys in the store: engines with different prefixes never see
    // each other.
    std::string key_prefix = "mooncake_te";
    // How long to wait for the first engine of the store to publish the secret.
    int64_t timeout_ms = 30000;
};

class SharedEngine : public std::enable_shared_from_this<SharedEngine> {
public:
    static Result<std::shared_ptr<SharedEngine>> create(std::shared_ptr<KVStore> store,
                                                        SharedEngineOptions options);
    ~SharedEngine();
    SharedEngine(const SharedEngine&) = delete;
    SharedEngine& operator=(const SharedEngine&) = delete;

    // The engine for one user (a group's fabric); releasing the last copy
    // returns the lease. kInvalidArgument once closed.
    Result<std::shared_ptr<te::TransferEngine>> lease();
    int leases() const;
    // Shuts the engine down. Refused (kInvalidArgument, naming the lease
    // count) while leases are out; a no-op when already closed.
    Status close();
    bool closed() const;

    // Direct use by the engine's owner; fails once closed.
    te::TransferEngine& engine() { return *engine_; }
    const std::string& segmentName() const { return engine_->segmentName(); }
    // A random token created once per store and key prefix: equal for engines
    // that can reach each other, different otherwise.
    const std::string& storeId() const { return store_id_; }
    const std::string& keyPrefix() const { return key_prefix_; }

private:
    SharedEngine() = default;
    void release();

    std::unique_ptr<te::TransferEngine> engine_;
    std::string store_id_;
    std::string key_prefix_;
    mutable std::mutex mu_;  // guards the two below
    int leases_ = 0;
    bool closed_ = false;
};

// What a rank publishes about its engine at group bootstrap: "" for a
// per-group engine, else the shared engine's store identity.
std::string engineChoice(const SharedEngine* shared);

// Every rank of a group must make the same engine choice: peers open each
// other's segments through their engine's store. Publishes `mine` under
// `group_key` and compares it with ranks [0, compare_ranks) (every founder;
// 1 for a joining process, which matches rank 0). kInvalidArgument naming
// the ranks and their choices on a mismatch (returned by each founder only
// once every founder has read the choices, so the store's host exiting on
// the error cannot cut another rank off from it), kTimeout at `deadline`.
Status agreeOnEngine(KVStore& store, const std::string& group_key, int rank, int compare_ranks,
                     const std::string& mine, Deadline deadline);

}  // namespace mooncake::pg
