// Runs a Coordinator on a thread, with its inbox in a KVStore (mailbox.h).
//
// It runs in the process of the group's in-group rank 0, next to that
// process's own MemberHost. It is not highly available: if that process dies
// the group keeps its last membership, collectives among the survivors still
// work, but nothing can change membership (no joins, activations,
// deactivations or reconciliations) until the group is re-created.
//
// The thread reads the Coordinator's inbox with a deadline of at most
// `poll_interval`, earlier when the Coordinator has a deadline due, so
// windows and proposal deadlines fire on time and stop() returns within
// about one poll interval. Everything the Coordinator says to members is
// pushed to their inboxes; its notifications go to the log (subsystem
// "coord").
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/control_plane/coordinator.h"
#include "mooncake-pg/control_plane/mailbox.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg::control_plane {

struct CoordinatorHostConfig {
    CoordinatorConfig coordinator;
    std::string key_prefix;  // the group's prefix in the store
    Millis poll_interval{50};
    // Called on the host thread with every effect after it was carried out
    // (tests and metrics); must not block or call back into the host.
    std::function<void(const CoordinatorEffect&)> observer;
};

class CoordinatorHost {
public:
    // Validates the config and starts the thread. `store` is not owned and
    // must outlive the host.
    static Result<std::unique_ptr<CoordinatorHost>> start(CoordinatorHostConfig config,
                                                          KVStore* store);
    ~CoordinatorHost();
    CoordinatorHost(const CoordinatorHost&) = delete;
    CoordinatorHost& operator=(const CoordinatorHost&) = delete;

    // Stops and joins the thread; idempotent. Messages still queued stay in
    // the store.
    void stop();

    // A copy of the Coordinator's table.
    GroupView view() const;

    // Waits until every slot's process has left (RankState Offline) or
    // `gone(rank)` says it is dead, or the deadline passes; whether they all
    // went. The group's store usually lives in this process: leaving before
    // the members stopped reading it fills their logs with store errors.
    bool awaitOthersGone(const std::function<bool(uint32_t)>& gone, Deadline deadline) const;

private:
    CoordinatorHost(CoordinatorHostConfig config, Coordinator coordinator, KVStore* store);

    void run();
    void execute(std::vector<CoordinatorEffect> effects);
    void push(uint32_t rank, const std::string& inbox, const std::string& bytes);

    const CoordinatorHostConfig config_;
    Mailbox mailbox_;
    const std::string inbox_;
    InboxReader reader_;     // host thread only
    mutable std::mutex mu_;  // guards coordinator_
    Coordinator coordinator_;
    // Only the host thread touches these.
    std::vector<std::string> slot_inbox_;  // from each slot's accepted registration
    bool store_error_logged_ = false;
    std::atomic<bool> stopping_{false};
    std::thread thread_;
};

}  // namespace mooncake::pg::control_plane
