#include "mooncake-pg/control_plane/messages.h"

#include <type_traits>
#include <utility>

#include "mooncake-transfer-engine/common/serialize.h"

namespace mooncake::pg::control_plane {

const char* messageTypeName(MessageType t) {
    switch (t) {
        case MessageType::kRegisterRequest:
            return "RegisterRequest";
        case MessageType::kRegisterReply:
            return "RegisterReply";
        case MessageType::kPublishEndpoint:
            return "PublishEndpoint";
        case MessageType::kJoinRequest:
            return "JoinRequest";
        case MessageType::kJoinRejected:
            return "JoinRejected";
        case MessageType::kActivateProposal:
            return "ActivateProposal";
        case MessageType::kDeactivateProposal:
            return "DeactivateProposal";
        case MessageType::kProposalResult:
            return "ProposalResult";
        case MessageType::kLinkReport:
            return "LinkReport";
        case MessageType::kFailureEvidence:
            return "FailureEvidence";
        case MessageType::kEvidenceAck:
            return "EvidenceAck";
        case MessageType::kReconcileStart:
            return "ReconcileStart";
        case MessageType::kReconcileResult:
            return "ReconcileResult";
        case MessageType::kViewUpdate:
            return "ViewUpdate";
        case MessageType::kLeave:
            return "Leave";
        case MessageType::kProbe:
            return "Probe";
        case MessageType::kProbeReply:
            return "ProbeReply";
    }
    return "Unknown";
}

MessageType messageType(const ControlMessage& m) {
    return std::visit([](const auto& b) { return std::decay_t<decltype(b)>::kType; }, m.body);
}

namespace {

// ---- writing ---------------------------------------------------------------

void putBool(ByteWriter& w, bool b) {
    w.put<uint8_t>(b ? 1 : 0);
}

void putRefs(ByteWriter& w, const std::vector<RankRef>& refs) {
    w.put<uint32_t>(static_cast<uint32_t>(refs.size()));
    for (const RankRef& r : refs) {
        w.put<uint32_t>(r.rank);
        w.put<uint32_t>(r.incarnation);
    }
}

template <typename T>
void putVector(ByteWriter& w, const std::vector<T>& v) {
    w.put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v)
        w.put<T>(x);
}

void putBody(ByteWriter& w, const RegisterRequest& b) {
    w.put<uint64_t>(b.nonce);
    putBool(w, b.is_extension);
    w.putString(b.endpoint);
}
void putBody(ByteWriter& w, const RegisterReply& b) {
    w.put<uint64_t>(b.nonce);
    putBool(w, b.accepted);
    w.put<uint32_t>(b.incarnation);
    w.putString(b.reason);
}
void putBody(ByteWriter& w, const PublishEndpoint& b) {
    w.putString(b.endpoint);
}
void putBody(ByteWriter& w, const JoinRequest& b) {
    w.put<uint32_t>(b.timeout_ms);
}
void putBody(ByteWriter& w, const JoinRejected& b) {
    w.put<uint8_t>(static_cast<uint8_t>(b.code));
    w.putString(b.reason);
}
void putBody(ByteWriter& w, const ActivateProposal& b) {
    w.put<uint64_t>(b.request_id);
    putRefs(w, b.targets);
    w.put<uint32_t>(b.timeout_ms);
}
void putBody(ByteWriter& w, const DeactivateProposal& b) {
    w.put<uint64_t>(b.request_id);
    putRefs(w, b.targets);
}
void putBody(ByteWriter& w, const ProposalResult& b) {
    w.put<uint64_t>(b.request_id);
    w.put<uint8_t>(static_cast<uint8_t>(b.code));
    w.putString(b.reason);
}
void putBody(ByteWriter& w, const LinkReport& b) {
    w.put<uint64_t>(b.reconcile_id);
    putVector(w, b.reached);
}
void putBody(ByteWriter& w, const FailureEvidence& b) {
    w.put<uint64_t>(b.request_id);
    putBool(w, b.local_success);
    putVector(w, b.failed_ranks_hint);
}
void putBody(ByteWriter& w, const EvidenceAck& b) {
    w.put<uint64_t>(b.request_id);
    w.put<uint64_t>(b.reconcile_id);
    w.put<uint32_t>(b.window_remaining_ms);
}
void putBody(ByteWriter& w, const ReconcileStart& b) {
    w.put<uint64_t>(b.reconcile_id);
    w.put<uint32_t>(b.window_ms);
}
void putBody(ByteWriter& w, const ReconcileResult& b) {
    w.put<uint64_t>(b.reconcile_id);
    putVector(w, b.healthy);
    putVector(w, b.unhealthy_active);
    putBool(w, b.deactivated);
}
void putBody(ByteWriter& w, const ViewUpdate& b) {
    w.put<uint64_t>(b.revision);
    putBool(w, b.bootstrapped);
    w.put<uint32_t>(static_cast<uint32_t>(b.slots.size()));
    for (const SlotInfo& s : b.slots) {
        w.put<uint8_t>(static_cast<uint8_t>(s.member));
        w.put<uint8_t>(static_cast<uint8_t>(s.rank));
        w.put<uint32_t>(s.incarnation);
        w.putString(s.endpoint);
        w.put<uint64_t>(s.active_since);
    }
}
void putBody(ByteWriter&, const Leave&) {}
void putBody(ByteWriter& w, const Probe& b) {
    w.put<uint64_t>(b.probe_id);
    w.put<uint32_t>(b.target_rank);
    w.put<uint32_t>(b.target_incarnation);
    w.put<uint64_t>(b.reply_nonce);
}
void putBody(ByteWriter& w, const ProbeReply& b) {
    w.put<uint64_t>(b.probe_id);
    w.put<uint32_t>(b.responder_incarnation);
}

// ---- reading ---------------------------------------------------------------

// Wraps ByteReader so every read names its field: the first failure is kept
// and reported, later reads are no-ops.
class Decoder {
public:
    explicit Decoder(std::string_view in) : r_(in) {}

    bool ok() const { return error_.empty(); }
    const std::string& error() const { return error_; }
    bool atEnd() const { return r_.atEnd(); }
    size_t remaining() const { return r_.remaining(); }

    template <typename T>
    T get(const char* field) {
        T v{};
        if (ok() && !r_.get(&v))
            fail(field, "truncated");
        return v;
    }
    bool getBool(const char* field) {
        uint8_t v = get<uint8_t>(field);
        if (v > 1)
            fail(field, "bool byte is not 0 or 1");
        return v == 1;
    }
    StatusCode getStatusCode(const char* field) {
        uint8_t v = get<uint8_t>(field);
        if (v > static_cast<uint8_t>(StatusCode::kInternal))
            fail(field, "undefined status code");
        return ok() ? static_cast<StatusCode>(v) : StatusCode::kOk;
    }
    std::string getString(const char* field, size_t max_len) {
        std::string s;
        if (!ok())
            return s;
        // Peek the length on a copy so "too long" and "truncated" read apart.
        ByteReader probe = r_;
        uint32_t n = 0;
        if (!probe.get(&n)) {
            fail(field, "truncated");
        } else if (n > max_len) {
            fail(field, "length " + std::to_string(n) + " exceeds " + std::to_string(max_len));
        } else if (!r_.getString(&s, max_len)) {
            fail(field, "truncated");
        }
        return s;
    }
    // Reads a u32 count and checks it against `max_count` and against the
    // bytes left (each element needs at least `min_elem_bytes`), so a forged
    // count cannot make us reserve memory the input could never fill.
    uint32_t getCount(const char* field, uint32_t max_count, size_t min_elem_bytes) {
        uint32_t n = get<uint32_t>(field);
        if (!ok())
            return 0;
        if (n > max_count) {
            fail(field, "count " + std::to_string(n) + " exceeds " + std::to_string(max_count));
            return 0;
        }
        if (static_cast<uint64_t>(n) * min_elem_bytes > r_.remaining()) {
            fail(field, "truncated (count " + std::to_string(n) + ")");
            return 0;
        }
        return n;
    }
    template <typename T>
    std::vector<T> getVector(const char* field, uint32_t max_count) {
        std::vector<T> v;
        uint32_t n = getCount(field, max_count, sizeof(T));
        v.reserve(n);
        for (uint32_t i = 0; i < n && ok(); ++i)
            v.push_back(get<T>(field));
        return v;
    }
    std::vector<uint8_t> getBitmap(const char* field) {
        std::vector<uint8_t> v = getVector<uint8_t>(field, kMaxGroupSlots);
        for (uint8_t b : v) {
            if (b > 1) {
                fail(field, "bitmap entry is not 0 or 1");
                break;
            }
        }
        return v;
    }
    std::vector<RankRef> getRefs(const char* field) {
        std::vector<RankRef> v;
        uint32_t n = getCount(field, kMaxGroupSlots, 2 * sizeof(uint32_t));
        v.reserve(n);
        for (uint32_t i = 0; i < n && ok(); ++i) {
            RankRef r;
            r.rank = get<uint32_t>(field);
            r.incarnation = get<uint32_t>(field);
            v.push_back(r);
        }
        return v;
    }

    void fail(const char* field, const std::string& why) {
        if (ok())
            error_ = std::string(field) + ": " + why;
    }

private:
    ByteReader r_;
    std::string error_;
};

void getBody(Decoder& d, RegisterRequest& b) {
    b.nonce = d.get<uint64_t>("nonce");
    b.is_extension = d.getBool("is_extension");
    b.endpoint = d.getString("endpoint", kMaxEndpointBytes);
}
void getBody(Decoder& d, RegisterReply& b) {
    b.nonce = d.get<uint64_t>("nonce");
    b.accepted = d.getBool("accepted");
    b.incarnation = d.get<uint32_t>("incarnation");
    b.reason = d.getString("reason", kMaxReasonBytes);
}
void getBody(Decoder& d, PublishEndpoint& b) {
    b.endpoint = d.getString("endpoint", kMaxEndpointBytes);
}
void getBody(Decoder& d, JoinRequest& b) {
    b.timeout_ms = d.get<uint32_t>("timeout_ms");
}
void getBody(Decoder& d, JoinRejected& b) {
    b.code = d.getStatusCode("code");
    b.reason = d.getString("reason", kMaxReasonBytes);
}
void getBody(Decoder& d, ActivateProposal& b) {
    b.request_id = d.get<uint64_t>("request_id");
    b.targets = d.getRefs("targets");
    b.timeout_ms = d.get<uint32_t>("timeout_ms");
}
void getBody(Decoder& d, DeactivateProposal& b) {
    b.request_id = d.get<uint64_t>("request_id");
    b.targets = d.getRefs("targets");
}
void getBody(Decoder& d, ProposalResult& b) {
    b.request_id = d.get<uint64_t>("request_id");
    b.code = d.getStatusCode("code");
    b.reason = d.getString("reason", kMaxReasonBytes);
}
void getBody(Decoder& d, LinkReport& b) {
    b.reconcile_id = d.get<uint64_t>("reconcile_id");
    b.reached = d.getVector<uint32_t>("reached", kMaxGroupSlots);
}
void getBody(Decoder& d, FailureEvidence& b) {
    b.request_id = d.get<uint64_t>("request_id");
    b.local_success = d.getBool("local_success");
    b.failed_ranks_hint = d.getBitmap("failed_ranks_hint");
}
void getBody(Decoder& d, EvidenceAck& b) {
    b.request_id = d.get<uint64_t>("request_id");
    b.reconcile_id = d.get<uint64_t>("reconcile_id");
    b.window_remaining_ms = d.get<uint32_t>("window_remaining_ms");
}
void getBody(Decoder& d, ReconcileStart& b) {
    b.reconcile_id = d.get<uint64_t>("reconcile_id");
    b.window_ms = d.get<uint32_t>("window_ms");
}
void getBody(Decoder& d, ReconcileResult& b) {
    b.reconcile_id = d.get<uint64_t>("reconcile_id");
    b.healthy = d.getBitmap("healthy");
    b.unhealthy_active = d.getVector<uint32_t>("unhealthy_active", kMaxGroupSlots);
    b.deactivated = d.getBool("deactivated");
}
void getBody(Decoder& d, ViewUpdate& b) {
    b.revision = d.get<uint64_t>("revision");
    b.bootstrapped = d.getBool("bootstrapped");
    // member + rank + incarnation + endpoint length + active_since.
    constexpr size_t kMinSlotBytes = 1 + 1 + 4 + 4 + 8;
    uint32_t n = d.getCount("slots", kMaxGroupSlots, kMinSlotBytes);
    b.slots.reserve(n);
    for (uint32_t i = 0; i < n && d.ok(); ++i) {
        SlotInfo s;
        auto member = groupMemberStateFromWire(d.get<uint8_t>("slots.member"));
        auto rank = rankStateFromWire(d.get<uint8_t>("slots.rank"));
        if (!member || !rank) {
            d.fail("slots", "undefined state value");
            break;
        }
        s.member = *member;
        s.rank = *rank;
        s.incarnation = d.get<uint32_t>("slots.incarnation");
        s.endpoint = d.getString("slots.endpoint", kMaxEndpointBytes);
        s.active_since = d.get<uint64_t>("slots.active_since");
        b.slots.push_back(std::move(s));
    }
}
void getBody(Decoder&, Leave&) {}
void getBody(Decoder& d, Probe& b) {
    b.probe_id = d.get<uint64_t>("probe_id");
    b.target_rank = d.get<uint32_t>("target_rank");
    b.target_incarnation = d.get<uint32_t>("target_incarnation");
    b.reply_nonce = d.get<uint64_t>("reply_nonce");
}
void getBody(Decoder& d, ProbeReply& b) {
    b.probe_id = d.get<uint64_t>("probe_id");
    b.responder_incarnation = d.get<uint32_t>("responder_incarnation");
}

template <typename Body>
MessageBody decodeAs(Decoder& d) {
    Body b;
    getBody(d, b);
    return b;
}

}  // namespace

std::string serialize(const ControlMessage& m) {
    ByteWriter w;
    w.put<uint32_t>(kControlMagic);
    w.put<uint8_t>(kControlVersion);
    w.put<uint8_t>(static_cast<uint8_t>(messageType(m)));
    w.putString(m.header.group_id);
    w.put<uint32_t>(m.header.sender_rank);
    w.put<uint32_t>(m.header.sender_incarnation);
    w.put<uint64_t>(m.header.view_epoch);
    w.putString(m.header.secret);
    std::visit([&w](const auto& b) { putBody(w, b); }, m.body);
    return w.take();
}

Result<ControlMessage> parseControlMessage(std::string_view bytes) {
    auto invalid = [](const std::string& why) {
        return InvalidArgument("control message: " + why);
    };
    if (bytes.size() > kMaxControlMessageBytes) {
        return invalid("size " + std::to_string(bytes.size()) + " exceeds " +
                       std::to_string(kMaxControlMessageBytes));
    }
    Decoder d(bytes);
    uint32_t magic = d.get<uint32_t>("magic");
    uint8_t version = d.get<uint8_t>("version");
    uint8_t type = d.get<uint8_t>("type");
    if (!d.ok())
        return invalid(d.error());
    if (magic != kControlMagic)
        return invalid("bad magic");
    if (version != kControlVersion) {
        return invalid("unsupported version " + std::to_string(version) + " (expected " +
                       std::to_string(kControlVersion) + ")");
    }

    ControlMessage m;
    m.header.group_id = d.getString("group_id", kMaxGroupIdBytes);
    m.header.sender_rank = d.get<uint32_t>("sender_rank");
    m.header.sender_incarnation = d.get<uint32_t>("sender_incarnation");
    m.header.view_epoch = d.get<uint64_t>("view_epoch");
    m.header.secret = d.getString("secret", kMaxSecretBytes);

    switch (static_cast<MessageType>(type)) {
        case MessageType::kRegisterRequest:
            m.body = decodeAs<RegisterRequest>(d);
            break;
        case MessageType::kRegisterReply:
            m.body = decodeAs<RegisterReply>(d);
            break;
        case MessageType::kPublishEndpoint:
            m.body = decodeAs<PublishEndpoint>(d);
            break;
        case MessageType::kJoinRequest:
            m.body = decodeAs<JoinRequest>(d);
            break;
        case MessageType::kJoinRejected:
            m.body = decodeAs<JoinRejected>(d);
            break;
        case MessageType::kActivateProposal:
            m.body = decodeAs<ActivateProposal>(d);
            break;
        case MessageType::kDeactivateProposal:
            m.body = decodeAs<DeactivateProposal>(d);
            break;
        case MessageType::kProposalResult:
            m.body = decodeAs<ProposalResult>(d);
            break;
        case MessageType::kLinkReport:
            m.body = decodeAs<LinkReport>(d);
            break;
        case MessageType::kFailureEvidence:
            m.body = decodeAs<FailureEvidence>(d);
            break;
        case MessageType::kEvidenceAck:
            m.body = decodeAs<EvidenceAck>(d);
            break;
        case MessageType::kReconcileStart:
            m.body = decodeAs<ReconcileStart>(d);
            break;
        case MessageType::kReconcileResult:
            m.body = decodeAs<ReconcileResult>(d);
            break;
        case MessageType::kViewUpdate:
            m.body = decodeAs<ViewUpdate>(d);
            break;
        case MessageType::kLeave:
            m.body = decodeAs<Leave>(d);
            break;
        case MessageType::kProbe:
            m.body = decodeAs<Probe>(d);
            break;
        case MessageType::kProbeReply:
            m.body = decodeAs<ProbeReply>(d);
            break;
        default:
            return invalid("unknown message type " + std::to_string(type));
    }
    if (!d.ok()) {
        return invalid(std::string(messageTypeName(static_cast<MessageType>(type))) + "." +
                       d.error());
    }
    if (!d.atEnd()) {
        return invalid(std::to_string(d.remaining()) + " trailing bytes after " +
                       messageTypeName(static_cast<MessageType>(type)));
    }
    if (const auto* view = std::get_if<ViewUpdate>(&m.body)) {
        // P2P restart decisions hang on active_since, so a value the
        // Coordinator cannot have sent is refused here.
        for (size_t r = 0; r < view->slots.size(); ++r) {
            const SlotInfo& s = view->slots[r];
            const bool active = s.member == GroupMemberState::kActive;
            if ((!active && s.active_since != 0) || s.active_since > m.header.view_epoch) {
                return invalid("ViewUpdate.slots[" + std::to_string(r) + "].active_since " +
                               std::to_string(s.active_since) + " with member state " +
                               groupMemberStateName(s.member) + " and view epoch " +
                               std::to_string(m.header.view_epoch) +
                               " (must be 0 unless Active, and at most the view epoch)");
            }
        }
    }
    return m;
}

}  // namespace mooncake::pg::control_plane
