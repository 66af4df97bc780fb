#include "mooncake-pg/control_plane/coordinator_host.h"

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <utility>

#include "mooncake-pg/control_plane/mailbox.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg::control_plane {
namespace {

std::string maskStr(const std::vector<int32_t>& mask) {
    std::string s = "[";
    for (size_t i = 0; i < mask.size(); ++i)
        s += (i ? "," : "") + std::to_string(mask[i]);
    return s + "]";
}

}  // namespace

Result<std::unique_ptr<CoordinatorHost>> CoordinatorHost::start(CoordinatorHostConfig config,
                                                                KVStore* store) {
    if (store == nullptr)
        return InvalidArgument("CoordinatorHost: no KVStore");
    if (config.poll_interval.count() <= 0)
        return InvalidArgument("CoordinatorHost: poll_interval must be positive");
    auto coordinator = Coordinator::create(config.coordinator);
    if (!coordinator.ok())
        return coordinator.status();
    std::unique_ptr<CoordinatorHost> host(
        new CoordinatorHost(std::move(config), std::move(coordinator).value(), store));
    host->thread_ = std::thread([h = host.get()] { h->run(); });
    return host;
}

CoordinatorHost::CoordinatorHost(CoordinatorHostConfig config, Coordinator coordinator,
                                 KVStore* store)
    : config_(std::move(config)),
      mailbox_(store, config_.key_prefix),
      inbox_(mailbox_.coordinatorInbox()),
      reader_(store, inbox_),
      coordinator_(std::move(coordinator)),
      slot_inbox_(config_.coordinator.max_group_size) {}

CoordinatorHost::~CoordinatorHost() {
    stop();
}

void CoordinatorHost::stop() {
    stopping_.store(true);
    if (thread_.joinable())
        thread_.join();
}

GroupView CoordinatorHost::view() const {
    std::lock_guard<std::mutex> lock(mu_);
    return coordinator_.view();
}

bool CoordinatorHost::awaitOthersGone(const std::function<bool(uint32_t)>& gone,
                                      Deadline deadline) const {
    // Leaves arrive through the inbox the host thread polls; there is
    // no condition to wait on, so poll the table at a fraction of that.
    constexpr auto kPoll = std::chrono::milliseconds(5);
    while (true) {
        bool all_gone = true;
        {
            const GroupView v = view();
            for (uint32_t r = 0; r < v.slots.size() && all_gone; ++r)
                all_gone = v.slots[r].rank == RankState::kOffline || gone(r);
        }
        if (all_gone)
            return true;
        if (deadline.expired())
            return false;
        std::this_thread::sleep_for(kPoll);
    }
}

void CoordinatorHost::run() {
    hostLog(LogLevel::kInfo,
            "coordinator for group '" + config_.coordinator.group_id + "' serving " + inbox_);
    while (!stopping_.load()) {
        // Wake for the next deadline, or after one poll interval to notice stop().
        Millis wait = config_.poll_interval;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto next = coordinator_.nextDeadline())
                wait = std::clamp(*next - hostNow(), Millis(0), wait);
        }
        auto got = reader_.receive(Deadline::after(wait));
        const bool store_failed = !got.ok() && got.status().code() != StatusCode::kTimeout;
        if (store_failed && !store_error_logged_) {
            // Logged once: a broken store would otherwise flood the log.
            hostLog(LogLevel::kError, "cannot read the Coordinator's inbox " + inbox_ + ": " +
                                          got.status().toString());
            store_error_logged_ = true;
        } else if (got.ok() && store_error_logged_) {
            hostLog(LogLevel::kInfo, "the Coordinator's inbox is readable again");
            store_error_logged_ = false;
        }

        std::vector<CoordinatorEffect> effects;
        {
            std::lock_guard<std::mutex> lock(mu_);
            const Millis now = hostNow();
            if (got.ok()) {
                effects = coordinator_.handleBytes(now, got.value());
            } else if (auto next = coordinator_.nextDeadline(); next && *next <= now) {
                effects = coordinator_.handle(Tick{now});
            }
        }
        execute(std::move(effects));
        if (store_failed && !stopping_.load()) {
            // A failing store answers at once; do not spin on it. Bounded by
            // the poll interval so stop() stays prompt.
            std::this_thread::sleep_for(config_.poll_interval);
        }
    }
    hostLog(LogLevel::kInfo,
            "coordinator for group '" + config_.coordinator.group_id + "' stopped");
}

void CoordinatorHost::push(uint32_t rank, const std::string& inbox, const std::string& bytes) {
    if (inbox.empty()) {
        hostLog(LogLevel::kWarn,
                "no inbox known for rank " + std::to_string(rank) + "; message dropped");
        return;
    }
    Status st = mailbox_.sendBytes(inbox, bytes);
    if (!st.ok()) {
        hostLog(LogLevel::kWarn,
                "push to rank " + std::to_string(rank) + " (" + inbox + "): " + st.toString());
    }
}

void CoordinatorHost::execute(std::vector<CoordinatorEffect> effects) {
    for (const CoordinatorEffect& effect : effects) {
        std::visit(
            [this](const auto& e) {
                using T = std::decay_t<decltype(e)>;
                if constexpr (std::is_same_v<T, SendTo>) {
                    if (e.rank >= slot_inbox_.size())
                        return;
                    std::string inbox = slot_inbox_[e.rank];
                    if (const auto* reply = std::get_if<RegisterReply>(&e.message.body)) {
                        // The registrant's own inbox: on a rejection the slot
                        // may still belong to another process.
                        inbox = mailbox_.processInbox(e.rank, reply->nonce);
                        if (reply->accepted)
                            slot_inbox_[e.rank] = inbox;
                    }
                    push(e.rank, inbox, serialize(e.message));
                } else if constexpr (std::is_same_v<T, Broadcast>) {
                    const std::string bytes = serialize(e.message);
                    for (uint32_t r : e.ranks) {
                        if (r < slot_inbox_.size())
                            push(r, slot_inbox_[r], bytes);
                    }
                } else if constexpr (std::is_same_v<T, Log>) {
                    hostLog(e.level, e.text);
                } else if constexpr (std::is_same_v<T, ViewCommitted>) {
                    // The Coordinator's own Log already announced the commit.
                    hostLog(LogLevel::kDebug, "epoch " + std::to_string(e.epoch) + " active mask " +
                                                  maskStr(e.active_mask));
                } else {
                    // ProposalFailed, JoinFailed and ReconciliationResult are
                    // logged by the Coordinator itself; they reach observers.
                }
            },
            effect);
        if (config_.observer)
            config_.observer(effect);
    }
}

}  // namespace mooncake::pg::control_plane
