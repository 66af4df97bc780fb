// Wire format of the control messages: round trips and hostile input.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "mooncake-pg/control_plane/messages.h"
#include "mooncake-transfer-engine/common/serialize.h"

namespace mooncake::pg::control_plane {
namespace {

MessageHeader header() {
    MessageHeader h;
    h.group_id = "group-7";
    h.sender_rank = 3;
    h.sender_incarnation = 2;
    h.view_epoch = 0x0102030405060708ull;
    h.secret = "s";
    return h;
}

// One message of every type with every field set to something non-default.
std::vector<ControlMessage> samples() {
    std::vector<MessageBody> bodies = {
        RegisterRequest{0xdeadbeefcafeull, true, "tcp://10.0.0.1:5000"},
        RegisterReply{42, true, 3, ""},
        RegisterReply{43, false, 0, "rank 1 is held by Active incarnation 1"},
        PublishEndpoint{"rdma://mlx5_0/1"},
        JoinRequest{120000},
        JoinRejected{StatusCode::kTimeout, "join_group timed out"},
        ActivateProposal{7, {RankRef{4, 1}, RankRef{5, 0}}, 30000},
        DeactivateProposal{8, {RankRef{2, 9}}},
        ProposalResult{7, StatusCode::kOk, ""},
        ProposalResult{8, StatusCode::kTimeout, "proposal failed: x"},
        LinkReport{3, {1, 0, 2, 7}},
        FailureEvidence{11, false, {0, 1, 0, 1}},
        FailureEvidence{12, true, {}},
        EvidenceAck{11, 3, 29000},
        ReconcileStart{3, 30000},
        ReconcileResult{3, {1, 1, 0, 1}, {2}, true},
        ViewUpdate{9,
                   true,
                   {SlotInfo{GroupMemberState::kActive, RankState::kHealthy, 1, "a",
                             0x0102030405060700ull},
                    SlotInfo{GroupMemberState::kInactive, RankState::kSynced, 2, ""},
                    SlotInfo{GroupMemberState::kLeft, RankState::kOffline, 1, ""},
                    SlotInfo{GroupMemberState::kAwaitingActivation, RankState::kHealthy, 4, "d"}}},
        Leave{},
        Probe{0x1122334455667788ull, 5, 2, 0x99aabbccddeeff00ull},
        ProbeReply{0x1122334455667788ull, 2},
    };
    std::vector<ControlMessage> out;
    for (auto& b : bodies)
        out.push_back(ControlMessage{header(), std::move(b)});
    return out;
}

TEST(ControlMessagesTest, EveryMessageTypeRoundTrips) {
    std::set<MessageType> seen;
    for (const ControlMessage& m : samples()) {
        seen.insert(messageType(m));
        std::string bytes = serialize(m);
        auto parsed = parseControlMessage(bytes);
        ASSERT_TRUE(parsed.ok()) << messageTypeName(messageType(m)) << ": "
                                 << parsed.status().toString();
        EXPECT_EQ(parsed.value(), m) << messageTypeName(messageType(m));
        EXPECT_EQ(serialize(parsed.value()), bytes);
    }
    EXPECT_EQ(seen.size(), std::variant_size_v<MessageBody>);
}

TEST(ControlMessagesTest, EveryTruncationIsRejected) {
    for (const ControlMessage& m : samples()) {
        std::string bytes = serialize(m);
        for (size_t n = 0; n < bytes.size(); ++n) {
            auto parsed = parseControlMessage(std::string_view(bytes).substr(0, n));
            ASSERT_FALSE(parsed.ok()) << messageTypeName(messageType(m)) << " cut at " << n;
            EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
        }
    }
}

TEST(ControlMessagesTest, TrailingBytesAreRejected) {
    for (const ControlMessage& m : samples()) {
        auto parsed = parseControlMessage(serialize(m) + '\0');
        ASSERT_FALSE(parsed.ok());
        EXPECT_NE(parsed.status().message().find("trailing"), std::string::npos);
    }
}

// Offset of the first body byte: magic, version, type, then the header.
size_t bodyOffset(const MessageHeader& h) {
    return 4 + 1 + 1 + 4 + h.group_id.size() + 4 + 4 + 8 + 4 + h.secret.size();
}

std::string withByte(std::string bytes, size_t at, uint8_t v) {
    bytes[at] = static_cast<char>(v);
    return bytes;
}

TEST(ControlMessagesTest, GarbageIsRejected) {
    const ControlMessage leave{header(), Leave{}};
    const std::string good = serialize(leave);
    auto expectBad = [](std::string_view b, const char* why) {
        auto parsed = parseControlMessage(b);
        ASSERT_FALSE(parsed.ok()) << why;
        EXPECT_NE(parsed.status().message().find(why), std::string::npos)
            << parsed.status().message();
    };
    expectBad(withByte(good, 0, 'X'), "bad magic");
    expectBad(withByte(good, 4, kControlVersion + 1), "unsupported version");
    expectBad(withByte(good, 4, kControlVersion - 1), "unsupported version");
    expectBad(withByte(good, 5, 0), "unknown message type 0");
    expectBad(withByte(good, 5, 18), "unknown message type 18");
    expectBad(withByte(good, 5, 255), "unknown message type 255");
    expectBad("", "magic");

    const size_t body = bodyOffset(header());
    // RegisterRequest.is_extension is a bool byte after the u64 nonce.
    std::string reg = serialize({header(), RegisterRequest{1, true, "e"}});
    expectBad(withByte(reg, body + 8, 2), "is_extension");
    // FailureEvidence bitmap entries are 0/1.
    std::string ev = serialize({header(), FailureEvidence{1, false, {0, 1}}});
    expectBad(withByte(ev, ev.size() - 1, 2), "failed_ranks_hint");
    // ViewUpdate states must be defined values.
    std::string view = serialize(
        {header(),
         ViewUpdate{1, true, {SlotInfo{GroupMemberState::kActive, RankState::kHealthy, 1, ""}}}});
    const size_t slot = body + 8 + 1 + 4;
    expectBad(withByte(view, slot, 5), "undefined state");
    expectBad(withByte(view, slot + 1, 3), "undefined state");
    // Status codes must be defined values.
    std::string res = serialize({header(), ProposalResult{1, StatusCode::kOk, ""}});
    expectBad(withByte(res, body + 8, 200), "undefined status code");
}

// active_since decides which P2P pairs restart, so values the Coordinator
// cannot send are refused: non-zero on a slot that is not Active, or later
// than the view's epoch.
TEST(ControlMessagesTest, ActiveSinceMustFitTheSlotAndTheEpoch) {
    MessageHeader h = header();
    h.view_epoch = 7;
    auto view = [&](GroupMemberState member, uint64_t since) {
        return parseControlMessage(serialize(
            {h, ViewUpdate{1, true, {SlotInfo{member, RankState::kHealthy, 1, "e", since}}}}));
    };
    for (uint64_t since : {0ull, 1ull, 7ull}) {
        auto ok = view(GroupMemberState::kActive, since);
        ASSERT_TRUE(ok.ok()) << since << ": " << ok.status().toString();
        EXPECT_EQ(std::get<ViewUpdate>(ok.value().body).slots.at(0).active_since, since);
    }
    auto late = view(GroupMemberState::kActive, 8);
    ASSERT_FALSE(late.ok());
    EXPECT_NE(late.status().message().find("slots[0].active_since 8"), std::string::npos)
        << late.status().message();
    for (auto member : {GroupMemberState::kInactive, GroupMemberState::kAwaitingActivation,
                        GroupMemberState::kLeft, GroupMemberState::kNone}) {
        EXPECT_TRUE(view(member, 0).ok()) << groupMemberStateName(member);
        auto bad = view(member, 3);
        ASSERT_FALSE(bad.ok()) << groupMemberStateName(member);
        EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(bad.status().message().find("must be 0 unless Active"), std::string::npos)
            << bad.status().message();
    }
}

TEST(ControlMessagesTest, OversizedFieldsAreRejectedBeforeAllocation) {
    auto expectBad = [](std::string_view b, const char* why) {
        auto parsed = parseControlMessage(b);
        ASSERT_FALSE(parsed.ok()) << why;
        EXPECT_NE(parsed.status().message().find(why), std::string::npos)
            << parsed.status().message();
    };
    MessageHeader h = header();
    h.group_id.assign(kMaxGroupIdBytes + 1, 'g');
    expectBad(serialize({h, Leave{}}), "group_id: length");
    h = header();
    h.secret.assign(kMaxSecretBytes + 1, 's');
    expectBad(serialize({h, Leave{}}), "secret: length");
    expectBad(serialize({header(), PublishEndpoint{std::string(kMaxEndpointBytes + 1, 'e')}}),
              "endpoint: length");
    expectBad(serialize({header(), JoinRejected{StatusCode::kTimeout,
                                                std::string(kMaxReasonBytes + 1, 'r')}}),
              "reason: length");
    // Maximal lengths are fine.
    EXPECT_TRUE(parseControlMessage(
                    serialize({header(), PublishEndpoint{std::string(kMaxEndpointBytes, 'e')}}))
                    .ok());

    // A count beyond the slot limit, and a count the remaining bytes cannot
    // hold, are both refused.
    ByteWriter w;
    w.put<uint32_t>(kControlMagic);
    w.put<uint8_t>(kControlVersion);
    w.put<uint8_t>(static_cast<uint8_t>(MessageType::kLinkReport));
    w.putString("g");
    w.put<uint32_t>(0);
    w.put<uint32_t>(0);
    w.put<uint64_t>(0);
    w.putString("");
    w.put<uint64_t>(0);  // reconcile_id
    std::string prefix = w.bytes();
    ByteWriter too_many;
    too_many.put<uint32_t>(kMaxGroupSlots + 1);
    expectBad(prefix + too_many.bytes(), "reached: count");
    ByteWriter lying;
    lying.put<uint32_t>(1000);
    lying.put<uint32_t>(1);
    expectBad(prefix + lying.bytes(), "reached: truncated");

    // A whole input beyond the message limit.
    std::string huge(kMaxControlMessageBytes + 1, '\0');
    expectBad(huge, "exceeds");
}

TEST(ControlMessagesTest, RandomInputNeverCrashesAndAcceptedInputIsCanonical) {
    std::mt19937_64 rng(12345);
    auto corpus = samples();
    int accepted = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string bytes = serialize(corpus[i % corpus.size()]);
        // Flip a few bytes, sometimes truncate or extend.
        int flips = 1 + static_cast<int>(rng() % 3);
        for (int f = 0; f < flips; ++f) {
            bytes[rng() % bytes.size()] = static_cast<char>(rng());
        }
        if (rng() % 4 == 0)
            bytes.resize(rng() % (bytes.size() + 8));
        auto parsed = parseControlMessage(bytes);
        if (!parsed.ok())
            continue;
        ++accepted;
        ASSERT_EQ(serialize(parsed.value()), bytes);
    }
    EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace mooncake::pg::control_plane
