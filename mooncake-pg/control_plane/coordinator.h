// The Coordinator: the single authority over a group's membership table.
//
// A pure state machine. The host (which owns the sockets, the timer and runs
// on global rank 0) parses what members send, feeds it in as Received events
// together with Ticks, and carries out the returned effects in order. Nothing
// here blocks, sleeps or reads a clock, so tests drive it directly.
//
// What it decides (details in docs/design/control-plane.md):
//  - registration: which process sits in which slot, with a per-slot
//    incarnation that grows with every new process in the slot;
//  - bootstrap: founders (slots < founding_size) become Active together once
//    all of them registered (epoch 1);
//  - activation proposals: commit when the group is ready and every target is
//    AwaitingActivation, Healthy, has an endpoint, and the resulting active
//    set is pairwise connected; otherwise pending until their deadline;
//  - deactivation proposals: commit at once;
//  - failure reconciliation: negative evidence opens a window; at its close
//    the healthy set is derived from the link reports of the window.
// Every change of the active set bumps the epoch; every change of the table
// bumps the revision and is broadcast as one ViewUpdate per handled event.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "mooncake-pg/control_plane/events.h"
#include "mooncake-pg/control_plane/failure_mode.h"
#include "mooncake-pg/control_plane/group_view.h"
#include "mooncake-pg/control_plane/messages.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::control_plane {

struct CoordinatorConfig {
    std::string group_id;
    std::string secret;
    uint32_t max_group_size = 0;
    uint32_t founding_size = 0;  // slots [0, founding_size) are founders
    FailureMode mode;
    Millis reconcile_window{30000};
    // Only used to validate reconcile_window (0: not known).
    Millis collective_timeout{0};
    Millis default_proposal_timeout{60000};
    Millis default_join_timeout{600000};
};

// Checks sizes, limits, the failure mode and the window.
Status validateCoordinatorConfig(const CoordinatorConfig& config);

using CoordinatorEvent = std::variant<Received, Tick>;

// ---- effects ---------------------------------------------------------------

// Send to the process in slot `rank`. A RegisterReply goes to the connection
// that sent the RegisterRequest with the same nonce (which may not be the
// slot's current connection when the reply is a rejection).
struct SendTo {
    uint32_t rank = 0;
    ControlMessage message;
};

// Send to each listed slot (every registered process, Active or not).
struct Broadcast {
    std::vector<uint32_t> ranks;
    ControlMessage message;
};

// The active set changed; `epoch` is the new epoch.
struct ViewCommitted {
    uint64_t epoch = 0;
    std::vector<int32_t> active_mask;
    int32_t group_size = 0;
    std::vector<uint32_t> activated;
    std::vector<uint32_t> deactivated;
    std::string cause;
};

// An activate or deactivate proposal did not commit. `reason` starts with
// "proposal failed: ".
struct ProposalFailed {
    uint32_t proposer = 0;
    uint64_t request_id = 0;
    std::string reason;
};

// A join_group timed out (or the joiner was deactivated before activation).
struct JoinFailed {
    uint32_t rank = 0;
    std::string reason;
};

struct ReconciliationResult {
    uint64_t reconcile_id = 0;
    std::vector<uint32_t> healthy;
    std::vector<uint32_t> unhealthy_active;
    bool deactivated = false;  // unhealthy_active were made Inactive
    bool exact = true;         // see HealthyChoice::exact
};

using CoordinatorEffect = std::variant<SendTo, Broadcast, ViewCommitted, ProposalFailed, JoinFailed,
                                       ReconciliationResult, Log>;

class Coordinator {
public:
    static Result<Coordinator> create(CoordinatorConfig config);

    std::vector<CoordinatorEffect> handle(const CoordinatorEvent& event);
    // Parses and handles; a message that does not parse becomes a Log.
    std::vector<CoordinatorEffect> handleBytes(Millis now, std::string_view bytes);

    // The earliest time a Tick changes something (window close, proposal or
    // join deadline); nullopt when nothing is pending.
    std::optional<Millis> nextDeadline() const;

    const GroupView& view() const { return view_; }
    const CoordinatorConfig& config() const { return config_; }
    bool reconciling() const { return window_.has_value(); }
    size_t pendingProposals() const { return pending_.size(); }

private:
    // What only the Coordinator knows about a slot.
    struct SlotState {
        bool registered = false;  // a live process holds the slot
        uint64_t nonce = 0;
        // links[r]: this process reported reaching the current process of r.
        // Empty until its first report; column r is cleared when r's process
        // changes, so old reports never vouch for a replacement.
        std::vector<bool> links;
        bool reported_in_window = false;
        std::vector<bool> window_links;
        // Since the window opened: some Active member's negative evidence
        // named this slot; this process sent anything at all; the slot was
        // already judged Offline when the window opened.
        bool blamed_in_window = false;
        bool heard_in_window = false;
        bool offline_at_open = false;
        std::optional<Millis> join_deadline;
        Millis join_timeout{0};
        std::string join_blocker;  // why activation proposals did not commit it
    };

    struct PendingActivation {
        uint32_t proposer = 0;
        uint32_t proposer_incarnation = 0;
        uint64_t request_id = 0;
        std::vector<RankRef> targets;
        Millis deadline{0};
        std::string blocker;
        uint64_t evaluated_at = UINT64_MAX;  // change_count_ of the last check
    };

    struct Window {
        uint64_t id = 0;
        Millis deadline{0};
    };

    explicit Coordinator(CoordinatorConfig config);

    // Dispatch (coordinator.cc).
    void onMessage(const ControlMessage& m);
    bool admit(const ControlMessage& m);
    void onRegister(const MessageHeader& h, const RegisterRequest& b);
    void onPublishEndpoint(uint32_t rank, const PublishEndpoint& b);
    void onJoinRequest(uint32_t rank, const JoinRequest& b);
    void onLeave(uint32_t rank);
    void maybeBootstrap();
    void advance();
    void expireJoins();
    void flush(std::vector<CoordinatorEffect>* out);

    // Proposals (coordinator_proposals.cc).
    void onActivate(const MessageHeader& h, const ActivateProposal& b);
    void onDeactivate(const MessageHeader& h, const DeactivateProposal& b);
    void evaluateProposals();
    std::string activationBlocker(const std::vector<RankRef>& targets) const;
    void finishProposal(uint32_t proposer, uint64_t request_id, StatusCode code,
                        const std::string& reason);

    // Evidence, links and reconciliation (coordinator_reconcile.cc).
    void onLinkReport(const MessageHeader& h, const LinkReport& b);
    void onEvidence(const MessageHeader& h, const FailureEvidence& b);
    void openWindow(const std::string& why);
    void closeWindow();
    // Whether the window can close before its deadline (coordinator_reconcile.cc).
    bool everyoneAccountedFor() const;
    void recomputeHealth();

    // Helpers.
    bool linked(const std::vector<bool>& row, uint32_t peer) const;
    bool bidirectional(uint32_t a, uint32_t b) const;
    std::vector<uint32_t> recipients() const;
    ControlMessage makeMessage(MessageBody body) const;
    void send(uint32_t rank, MessageBody body);
    void broadcast(MessageBody body);
    void sendViewTo(uint32_t rank) { view_requests_.push_back(rank); }
    // Starts the next epoch. Slot member states are already updated; this
    // stamps active_since: the new epoch for `activated` (and for every Active
    // member when `restart_all`, so their P2P pairs restart in step), 0 for
    // slots that are not Active.
    void commitActiveSet(const std::vector<uint32_t>& activated,
                         const std::vector<uint32_t>& deactivated, const std::string& cause,
                         bool restart_all = false);
    void tableChanged() {
        view_changed_ = true;
        ++change_count_;
    }
    void log(LogLevel level, std::string text) { out_.push_back(Log{level, std::move(text)}); }
    uint32_t activeCount() const;

    CoordinatorConfig config_;
    GroupView view_;
    std::vector<SlotState> slots_;
    std::vector<PendingActivation> pending_;
    std::optional<Window> window_;
    uint64_t next_reconcile_id_ = 1;
    Millis now_{0};

    // Per handle() call: effects in order, whether to broadcast the table,
    // and who asked for a private copy of it.
    std::vector<CoordinatorEffect> out_;
    bool view_changed_ = false;
    std::vector<uint32_t> view_requests_;
    // Bumped on any change that can unblock a pending proposal.
    uint64_t change_count_ = 0;
};

}  // namespace mooncake::pg::control_plane
