// Every message of the control plane, as plain structs, and their wire form.
//
// Wire form (little-endian, built with ByteWriter/ByteReader):
//   u32 magic 'MCCP' | u8 version | u8 type | header | body
// with strings as u32 length + bytes and vectors as u32 count + elements.
// The parser is written for hostile input: every length and count is bounded
// before anything is allocated, enum bytes and bools must hold defined values,
// and trailing bytes are an error, so parse(serialize(m)) == m and
// serialize(parse(b)) == b for every accepted b.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "mooncake-pg/control_plane/states.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::control_plane {

// Sender rank of messages the Coordinator sends (it is not a group slot).
inline constexpr uint32_t kCoordinatorSender = 0xFFFFFFFFu;

// Bounds enforced by the parser (and by Coordinator/MemberAgent configs).
inline constexpr uint32_t kMaxGroupSlots = 1u << 14;
inline constexpr size_t kMaxGroupIdBytes = 256;
inline constexpr size_t kMaxSecretBytes = 256;
inline constexpr size_t kMaxEndpointBytes = 512;
inline constexpr size_t kMaxReasonBytes = 4096;
// A full ViewUpdate of kMaxGroupSlots slots with maximal endpoints fits.
inline constexpr size_t kMaxControlMessageBytes = 16u << 20;

inline constexpr uint32_t kControlMagic = 0x5043434Du;  // "MCCP"
inline constexpr uint8_t kControlVersion = 2;           // 2: SlotInfo.active_since

enum class MessageType : uint8_t {
    kRegisterRequest = 1,
    kRegisterReply = 2,
    kPublishEndpoint = 3,
    kJoinRequest = 4,
    kJoinRejected = 5,
    kActivateProposal = 6,
    kDeactivateProposal = 7,
    kProposalResult = 8,
    kLinkReport = 9,
    kFailureEvidence = 10,
    kEvidenceAck = 11,
    kReconcileStart = 12,
    kReconcileResult = 13,
    kViewUpdate = 14,
    kLeave = 15,
    // Member <-> member link probes (control_plane/member_host.h); the
    // Coordinator never sends or accepts them.
    kProbe = 16,
    kProbeReply = 17,
};

const char* messageTypeName(MessageType t);

// Carried by every message. The Coordinator drops messages whose group id or
// secret differ or whose sender is not a slot; stale incarnations and epochs
// make evidence ignorable (see coordinator.h).
struct MessageHeader {
    std::string group_id;
    uint32_t sender_rank = 0;
    uint32_t sender_incarnation = 0;  // 0 before the Coordinator assigned one
    uint64_t view_epoch = 0;          // the sender's view when it sent this
    std::string secret;
    bool operator==(const MessageHeader&) const = default;
};

// A slot together with the process the proposer saw in it. incarnation 0
// means "whichever process sits there now"; a non-zero incarnation that no
// longer matches makes the Coordinator skip that target, so a decision made
// about a dead process is never applied to its replacement.
struct RankRef {
    uint32_t rank = 0;
    uint32_t incarnation = 0;
    bool operator==(const RankRef&) const = default;
};

// Member -> Coordinator: a process takes a slot. `nonce` identifies the
// process (random per process), so a retransmitted registration is recognised
// and a different process in the same slot is a replacement.
struct RegisterRequest {
    static constexpr MessageType kType = MessageType::kRegisterRequest;
    uint64_t nonce = 0;
    bool is_extension = false;
    std::string endpoint;  // may be empty and published later
    bool operator==(const RegisterRequest&) const = default;
};

// Coordinator -> registrant (routed by nonce: the slot may still belong to
// another process when this is a rejection).
struct RegisterReply {
    static constexpr MessageType kType = MessageType::kRegisterReply;
    uint64_t nonce = 0;
    bool accepted = false;
    uint32_t incarnation = 0;
    std::string reason;
    bool operator==(const RegisterReply&) const = default;
};

struct PublishEndpoint {
    static constexpr MessageType kType = MessageType::kPublishEndpoint;
    std::string endpoint;
    bool operator==(const PublishEndpoint&) const = default;
};

// Member -> Coordinator: local warmup is done; Inactive -> AwaitingActivation.
struct JoinRequest {
    static constexpr MessageType kType = MessageType::kJoinRequest;
    uint32_t timeout_ms = 0;  // 0: the Coordinator's default
    bool operator==(const JoinRequest&) const = default;
};

// Coordinator -> joiner: the join deadline passed (kTimeout), or the joiner
// was deactivated or is not allowed to join (kAborted / kInvalidArgument).
struct JoinRejected {
    static constexpr MessageType kType = MessageType::kJoinRejected;
    StatusCode code = StatusCode::kAborted;
    std::string reason;
    bool operator==(const JoinRejected&) const = default;
};

struct ActivateProposal {
    static constexpr MessageType kType = MessageType::kActivateProposal;
    uint64_t request_id = 0;
    std::vector<RankRef> targets;
    uint32_t timeout_ms = 0;  // 0: the Coordinator's default
    bool operator==(const ActivateProposal&) const = default;
};

struct DeactivateProposal {
    static constexpr MessageType kType = MessageType::kDeactivateProposal;
    uint64_t request_id = 0;
    std::vector<RankRef> targets;
    bool operator==(const DeactivateProposal&) const = default;
};

// Coordinator -> proposer. The header's view_epoch is the epoch after commit.
// code kOk: committed (reason may list skipped targets); kTimeout: it stayed
// blocked until its deadline; kInvalidArgument: rejected on arrival.
struct ProposalResult {
    static constexpr MessageType kType = MessageType::kProposalResult;
    uint64_t request_id = 0;
    StatusCode code = StatusCode::kOk;
    std::string reason;
    bool operator==(const ProposalResult&) const = default;
};

// Member -> Coordinator: which peers this process can reach. reached[r] is
// the incarnation of the process in slot r that was reached, 0 if none; a
// report about an incarnation that has since been replaced counts as "not
// reached". Length max_group_size.
struct LinkReport {
    static constexpr MessageType kType = MessageType::kLinkReport;
    uint64_t reconcile_id = 0;  // the window it answers, 0 if unsolicited
    std::vector<uint32_t> reached;
    bool operator==(const LinkReport&) const = default;
};

// Member -> Coordinator after an operation (sync_after_failure).
struct FailureEvidence {
    static constexpr MessageType kType = MessageType::kFailureEvidence;
    uint64_t request_id = 0;  // echoed in the EvidenceAck
    bool local_success = true;
    std::vector<uint8_t> failed_ranks_hint;  // 0/1 per slot, may be empty
    bool operator==(const FailureEvidence&) const = default;
};

// Coordinator -> evidence sender. reconcile_id != 0: wait for that window's
// ReconcileResult. reconcile_id == 0: nothing to wait for; the view sent just
// before this ack is the latest.
struct EvidenceAck {
    static constexpr MessageType kType = MessageType::kEvidenceAck;
    uint64_t request_id = 0;
    uint64_t reconcile_id = 0;
    uint32_t window_remaining_ms = 0;
    bool operator==(const EvidenceAck&) const = default;
};

// Coordinator -> all: a window opened; answer with a LinkReport.
struct ReconcileStart {
    static constexpr MessageType kType = MessageType::kReconcileStart;
    uint64_t reconcile_id = 0;
    uint32_t window_ms = 0;
    bool operator==(const ReconcileStart&) const = default;
};

struct ReconcileResult {
    static constexpr MessageType kType = MessageType::kReconcileResult;
    uint64_t reconcile_id = 0;
    std::vector<uint8_t> healthy;            // 0/1 per slot
    std::vector<uint32_t> unhealthy_active;  // Active members outside the healthy set
    bool deactivated = false;                // whether they were made Inactive
    bool operator==(const ReconcileResult&) const = default;
};

struct SlotInfo {
    GroupMemberState member = GroupMemberState::kNone;
    RankState rank = RankState::kOffline;
    uint32_t incarnation = 0;
    std::string endpoint;
    // The view epoch at which this slot's current member became Active (or
    // was restarted in step with every other Active member by a failure
    // reconciliation); 0 when not Active. A P2P pair restarts exactly when
    // max(active_since) of its two ranks changes (docs/design/control-plane.md).
    uint64_t active_since = 0;
    bool operator==(const SlotInfo&) const = default;
};

// Coordinator -> members: the whole table. The header's view_epoch is the
// epoch (changes with the active set); revision changes with any field.
struct ViewUpdate {
    static constexpr MessageType kType = MessageType::kViewUpdate;
    uint64_t revision = 0;
    bool bootstrapped = false;
    std::vector<SlotInfo> slots;
    bool operator==(const ViewUpdate&) const = default;
};

struct Leave {
    static constexpr MessageType kType = MessageType::kLeave;
    bool operator==(const Leave&) const = default;
};

// Member -> member, straight into the peer's inbox: "are you the process
// (target_rank, target_incarnation)?". reply_nonce names the prober's inbox,
// because the target's view may not show the prober's endpoint yet (a
// registrant probes as soon as it sees the table, possibly before its peers
// have applied the view that announces it).
struct Probe {
    static constexpr MessageType kType = MessageType::kProbe;
    uint64_t probe_id = 0;
    uint32_t target_rank = 0;
    uint32_t target_incarnation = 0;
    uint64_t reply_nonce = 0;
    bool operator==(const Probe&) const = default;
};

// The answer, from the process that sits in target_rank; the prober reports
// responder_incarnation as reached (the Coordinator ignores it if stale).
struct ProbeReply {
    static constexpr MessageType kType = MessageType::kProbeReply;
    uint64_t probe_id = 0;
    uint32_t responder_incarnation = 0;
    bool operator==(const ProbeReply&) const = default;
};

using MessageBody = std::variant<RegisterRequest, RegisterReply, PublishEndpoint, JoinRequest,
                                 JoinRejected, ActivateProposal, DeactivateProposal, ProposalResult,
                                 LinkReport, FailureEvidence, EvidenceAck, ReconcileStart,
                                 ReconcileResult, ViewUpdate, Leave, Probe, ProbeReply>;

struct ControlMessage {
    MessageHeader header;
    MessageBody body;
    bool operator==(const ControlMessage&) const = default;
};

MessageType messageType(const ControlMessage& m);

std::string serialize(const ControlMessage& m);

// kInvalidArgument naming the field that failed, for anything that
// serialize() could not have produced.
Result<ControlMessage> parseControlMessage(std::string_view bytes);

}  // namespace mooncake::pg::control_plane
