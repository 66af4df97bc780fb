// The member side of the control plane: one MemberAgent per process and
// group. A pure state machine like the Coordinator: the torch layer's calls
// (register, join_group, activate_ranks, sync_after_failure, ...) and the
// Coordinator's messages come in as events; messages to send, link probes to
// run, views to apply and operation completions go out as effects.
//
// It keeps the local mirror of the membership table. get_active_ranks,
// get_peer_state and get_num_synced_ranks read the mirror only: they are
// local and never communicate.
//
// Blocking calls are modelled as commands with a host-chosen request_id;
// each completes with exactly one OpCompleted carrying that id, either from
// a Coordinator answer or from a local deadline (the Coordinator-side
// deadline plus `reply_grace`), so a lost Coordinator cannot hang a caller.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mooncake-pg/control_plane/events.h"
#include "mooncake-pg/control_plane/failure_mode.h"
#include "mooncake-pg/control_plane/group_view.h"
#include "mooncake-pg/control_plane/messages.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::control_plane {

struct MemberAgentConfig {
    std::string group_id;
    std::string secret;
    uint32_t rank = 0;
    uint32_t max_group_size = 0;
    bool is_extension = false;
    // Identifies this process to the Coordinator; must differ between a
    // process and its replacement (the host draws it at random).
    uint64_t nonce = 0;
    FailureMode mode;
    Millis register_timeout{60000};
    Millis default_join_timeout{600000};
    Millis default_proposal_timeout{60000};
    // Extra time granted past a Coordinator-side deadline for its answer.
    Millis reply_grace{10000};
};

Status validateMemberAgentConfig(const MemberAgentConfig& config);

// ---- commands (the torch layer's calls) ------------------------------------

// Completes for an extension once it holds its slot (Inactive); for a
// founder once the group bootstrapped and it is Active.
struct RegisterCmd {
    Millis now{0};
    uint64_t request_id = 0;
    std::string endpoint;  // may be empty, then PublishEndpointCmd later
};
struct PublishEndpointCmd {
    Millis now{0};
    std::string endpoint;
};
struct JoinGroupCmd {
    Millis now{0};
    uint64_t request_id = 0;
    Millis timeout{0};  // 0: config default
};
struct ActivateRanksCmd {  // also recover_ranks
    Millis now{0};
    uint64_t request_id = 0;
    std::vector<uint32_t> ranks;
    Millis timeout{0};
};
struct DeactivateRanksCmd {
    Millis now{0};
    uint64_t request_id = 0;
    std::vector<uint32_t> ranks;
};
struct SyncAfterFailureCmd {
    Millis now{0};
    uint64_t request_id = 0;
    bool local_success = false;
    std::vector<uint8_t> failed_ranks_hint;  // empty or max_group_size entries
    // The epoch whose data plane failed (0: the applied view's). Evidence of
    // an older epoch is stamped with it, so a Coordinator that already
    // restarted the data plane after that failure reads it as stale instead
    // of opening another reconciliation for it.
    uint64_t observed_epoch = 0;
};
// The host's answer to ProbeLinks: reached[r] = incarnation of the process in
// slot r that answered, 0 if unreachable (max_group_size entries).
struct LinksProbedCmd {
    Millis now{0};
    std::vector<uint32_t> reached;
};
struct LeaveCmd {
    Millis now{0};
};

using AgentEvent =
    std::variant<Received, Tick, RegisterCmd, PublishEndpointCmd, JoinGroupCmd, ActivateRanksCmd,
                 DeactivateRanksCmd, SyncAfterFailureCmd, LinksProbedCmd, LeaveCmd>;

// ---- effects ---------------------------------------------------------------

struct SendToCoordinator {
    ControlMessage message;
};

struct PeerToProbe {
    uint32_t rank = 0;
    uint32_t incarnation = 0;
    std::string endpoint;
};

// Check which peers answer (both directions are judged by the Coordinator
// from both sides' reports) and reply with LinksProbedCmd.
struct ProbeLinks {
    uint64_t reconcile_id = 0;  // non-zero: a reconciliation window asks
    std::vector<PeerToProbe> peers;
};

// The mirror took a newer view. The host updates the active_ranks tensor and
// the communicator's membership from it.
struct ViewApplied {
    uint64_t epoch = 0;
    uint64_t revision = 0;
    std::vector<int32_t> active_mask;
    int32_t group_size = 0;
    GroupMemberState self_state = GroupMemberState::kNone;
    bool active_set_changed = false;
};

enum class OpKind : uint8_t { kRegister, kJoin, kActivate, kDeactivate, kSync };
const char* opKindName(OpKind k);

struct OpCompleted {
    uint64_t request_id = 0;
    OpKind kind = OpKind::kRegister;
    Status status;
    uint64_t epoch = 0;  // the mirror's epoch when it completed
};

using AgentEffect = std::variant<SendToCoordinator, ProbeLinks, ViewApplied, OpCompleted, Log>;

class MemberAgent {
public:
    static Result<MemberAgent> create(MemberAgentConfig config);

    std::vector<AgentEffect> handle(const AgentEvent& event);
    // Parses and handles; a message that does not parse becomes a Log.
    std::vector<AgentEffect> handleBytes(Millis now, std::string_view bytes);

    // Earliest local deadline of a pending operation.
    std::optional<Millis> nextDeadline() const;

    // ---- local, non-collective queries (the mirror) ----
    const std::vector<int32_t>& activeRanks() const { return active_mask_; }
    int32_t groupSize() const { return groupSizeFromMask(active_mask_); }
    // Per rank, whether it is ready to be activated: AwaitingActivation,
    // Healthy and an endpoint published (an activation proposal for it would
    // not be refused for the target's own state), or already Active (a
    // proposal for it succeeds at once). Active counts as ready so that the
    // documented loop `while not all(get_peer_state(...)): ...;
    // recover_ranks(...)` on every member ends even on those that see
    // another member's activation commit first. Out-of-range ranks read
    // false.
    std::vector<bool> peerState(const std::vector<uint32_t>& ranks) const;
    // Slots whose process is registered (Synced or Healthy) and published an
    // endpoint: the ranks this process knows how to reach.
    int numSyncedRanks() const;
    // kLeft when another process has taken over this slot.
    GroupMemberState selfState() const;
    bool registered() const { return incarnation_ != 0; }
    uint32_t incarnation() const { return incarnation_; }
    uint64_t epoch() const { return view_.epoch; }
    const GroupView& view() const { return view_; }
    const MemberAgentConfig& config() const { return config_; }

private:
    struct PendingOp {
        OpKind kind = OpKind::kRegister;
        Millis deadline{0};
        uint64_t wait_epoch = 0;      // proposal committed: wait for this view
        uint64_t wait_reconcile = 0;  // sync: wait for this window's result
        bool acked = false;           // sync: the Coordinator answered
    };

    explicit MemberAgent(MemberAgentConfig config);

    void onMessage(const ControlMessage& m);
    void onView(const ControlMessage& m, const ViewUpdate& v);
    void onRegisterReply(const RegisterReply& b);
    void onProposalResult(const ControlMessage& m, const ProposalResult& b);
    void onEvidenceAck(const EvidenceAck& b);
    void onReconcileResult(const ReconcileResult& b);
    void onJoinRejected(const JoinRejected& b);

    void doRegister(const RegisterCmd& c);
    void doPublish(const PublishEndpointCmd& c);
    void doJoin(const JoinGroupCmd& c);
    void doPropose(uint64_t request_id, OpKind kind, const std::vector<uint32_t>& ranks,
                   Millis timeout);
    void doSync(const SyncAfterFailureCmd& c);
    void doLinksProbed(const LinksProbedCmd& c);
    void doLeave();

    void failRegistrations(const Status& st);
    void completeRegistrationsIfReady();
    void expire();
    void complete(uint64_t request_id, Status status);
    bool reject(uint64_t request_id, OpKind kind, Status status);
    void probe(uint64_t reconcile_id);
    void send(MessageBody body);
    void send(MessageBody body, uint64_t view_epoch);
    void log(LogLevel level, std::string text) { out_.push_back(Log{level, std::move(text)}); }

    MemberAgentConfig config_;
    GroupView view_;
    std::vector<int32_t> active_mask_;
    uint32_t incarnation_ = 0;
    std::string endpoint_;
    std::string registered_endpoint_;  // the one sent with RegisterRequest
    std::map<uint64_t, PendingOp> ops_;
    uint64_t open_reconcile_ = 0;  // the window we were asked to report for
    uint64_t last_result_ = 0;     // newest ReconcileResult seen
    Millis now_{0};
    std::vector<AgentEffect> out_;
};

}  // namespace mooncake::pg::control_plane
