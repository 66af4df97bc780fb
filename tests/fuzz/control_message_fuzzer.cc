// Fuzzes the control-plane wire format and the two state machines behind it.
//
// 1. parseControlMessage must accept or reject any bytes without reading out
//    of bounds, and what it accepts must be canonical: serialize() gives the
//    input back, and that re-parses to an equal message.
// 2. An accepted message is then fed to a Coordinator (a bootstrapped 4-of-8
//    group with a pending joiner) and to a MemberAgent, copies of templates
//    built once, which must neither crash nor break their invariants. The
//    seeds carry the right group id and secret so they pass admission.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake-pg/control_plane/coordinator.h"
#include "mooncake-pg/control_plane/member_agent.h"
#include "mooncake-pg/control_plane/messages.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using namespace mooncake::pg::control_plane;
using mooncake::StatusCode;

constexpr uint32_t kSlots = 8;
constexpr const char* kGroup = "fuzz";
constexpr const char* kSecret = "k";

#define require(cond)                                                                    \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            std::fprintf(stderr, "requirement failed: %s (line %d)\n", #cond, __LINE__); \
            std::abort();                                                                \
        }                                                                                \
    } while (0)

ControlMessage make(uint32_t sender, uint32_t incarnation, uint64_t epoch, MessageBody body) {
    ControlMessage m;
    m.header.group_id = kGroup;
    m.header.sender_rank = sender;
    m.header.sender_incarnation = incarnation;
    m.header.view_epoch = epoch;
    m.header.secret = kSecret;
    m.body = std::move(body);
    return m;
}

Coordinator buildCoordinator() {
    CoordinatorConfig c;
    c.group_id = kGroup;
    c.secret = kSecret;
    c.max_group_size = kSlots;
    c.founding_size = 4;
    auto coord = std::move(Coordinator::create(c).value());
    for (uint32_t r = 0; r < 4; ++r) {
        coord.handle(Received{Millis(0), make(r, 0, 0, RegisterRequest{100 + r, false, "e"})});
    }
    coord.handle(Received{Millis(0), make(4, 0, 1, RegisterRequest{104, true, "e"})});
    coord.handle(Received{Millis(0), make(4, 1, 1, JoinRequest{0})});
    return coord;
}

MemberAgent buildAgent() {
    MemberAgentConfig c;
    c.group_id = kGroup;
    c.secret = kSecret;
    c.rank = 1;
    c.max_group_size = kSlots;
    c.nonce = 101;
    auto agent = std::move(MemberAgent::create(c).value());
    agent.handle(RegisterCmd{Millis(0), 1, "e"});
    agent.handle(
        Received{Millis(0), make(kCoordinatorSender, 0, 1, RegisterReply{101, true, 1, ""})});
    agent.handle(SyncAfterFailureCmd{Millis(0), 2, false, {}});
    return agent;
}

void checkView(const GroupView& v) {
    require(v.slots.size() == kSlots);
    require(v.groupSize() >= 0 && v.groupSize() <= static_cast<int32_t>(kSlots));
}

}  // namespace

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    std::vector<uint32_t> reach(kSlots, 1);
    std::vector<uint8_t> hint(kSlots, 0);
    hint[2] = 1;
    std::vector<SlotInfo> slots(kSlots);
    slots[1] = SlotInfo{GroupMemberState::kActive, RankState::kHealthy, 1, "e", 2};
    std::vector<ControlMessage> seeds = {
        make(5, 0, 1, RegisterRequest{7, true, "tcp://x"}),
        make(0, 1, 1, ActivateProposal{1, {RankRef{4, 1}}, 1000}),
        make(0, 1, 1, DeactivateProposal{2, {RankRef{3, 0}}}),
        make(2, 1, 1, LinkReport{0, reach}),
        make(0, 1, 1, FailureEvidence{3, false, hint}),
        make(3, 1, 1, PublishEndpoint{"tcp://y"}),
        make(3, 1, 1, Leave{}),
        make(4, 1, 1, JoinRequest{5}),
        make(kCoordinatorSender, 0, 2, ViewUpdate{9, true, slots}),
        make(kCoordinatorSender, 0, 1, EvidenceAck{2, 1, 100}),
        make(kCoordinatorSender, 0, 1, ReconcileStart{1, 30000}),
        make(kCoordinatorSender, 0, 1,
             ReconcileResult{1, std::vector<uint8_t>(kSlots, 1), {}, false}),
        make(kCoordinatorSender, 0, 1, ProposalResult{1, StatusCode::kTimeout, "x"}),
        make(kCoordinatorSender, 0, 1, JoinRejected{StatusCode::kTimeout, "x"}),
        make(kCoordinatorSender, 0, 1, RegisterReply{101, false, 0, "x"}),
        make(2, 1, 1, Probe{5, 1, 1, 0x1234}),
        make(1, 1, 1, ProbeReply{5, 1}),
    };
    std::vector<std::string> out;
    for (const auto& m : seeds)
        out.push_back(serialize(m));
    return out;
}

}  // namespace mooncake::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto parsed = parseControlMessage(bytes);
    if (!parsed.ok()) {
        require(parsed.status().code() == StatusCode::kInvalidArgument);
        return 0;
    }
    const ControlMessage& m = parsed.value();
    const std::string again = serialize(m);
    require(again == bytes);
    auto reparsed = parseControlMessage(again);
    require(reparsed.ok() && reparsed.value() == m);

    static const Coordinator kCoordinator = buildCoordinator();
    static const MemberAgent kAgent = buildAgent();
    Coordinator coord = kCoordinator;
    coord.handle(Received{Millis(1), m});
    // Wire timeouts are u32 milliseconds (< 50 days): after this every
    // deadline has passed.
    const Millis later = Millis(1) + std::chrono::hours(24 * 60);
    coord.handle(Tick{later});
    checkView(coord.view());
    require(!coord.nextDeadline().has_value() || coord.reconciling());

    MemberAgent agent = kAgent;
    agent.handle(Received{Millis(1), m});
    agent.handle(Tick{later});
    checkView(agent.view());
    require(agent.activeRanks().size() == kSlots);
    require(!agent.nextDeadline().has_value());
    return 0;
}
