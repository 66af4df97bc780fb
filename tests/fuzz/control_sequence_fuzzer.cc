// Stateful fuzzing of the control plane: one Coordinator and the
// MemberAgents of a 4-slot group (2 founders), wired through a simulated
// network that the input drives. Each step is one decision: deliver,
// reorder, drop or duplicate a message; advance time; issue a command
// (register, join, activate, deactivate, sync, probe answers, leave);
// start a replacement process in a slot while the old one lives on; kill a
// process. After every step the harness checks invariants that hold for any
// interleaving:
//  - the Coordinator's epoch and revision never go back; its active set
//    changes only with a new epoch; every epoch is announced by one
//    ViewCommitted, in order, the last of an event carrying the table's mask;
//  - every message either machine emits is addressed within the group,
//    carries the group's identity and survives serialize/parse unchanged;
//  - an agent's applied views have increasing revisions and equal the
//    Coordinator's table at that revision (no view is invented or mixed);
//  - no two live processes of one slot both believe they are Active at the
//    same epoch;
//  - every command completes exactly once; after the network drains and all
//    deadlines pass, none of a live process's commands is still open.
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "mooncake-pg/control_plane/coordinator.h"
#include "mooncake-pg/control_plane/member_agent.h"
#include "mooncake-pg/control_plane/messages.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_require.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using namespace mooncake::pg::control_plane;
using mooncake::fuzz::FuzzInput;

constexpr uint32_t kSlots = 4;
constexpr uint32_t kFounders = 2;
constexpr const char* kGroup = "seq";
constexpr const char* kSecret = "s";
constexpr size_t kMaxProcsPerSlot = 2;

template <class... F>
struct Overloaded : F... {
    using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

void checkWellFormed(const ControlMessage& m, bool from_coordinator) {
    MC_FUZZ_REQUIRE(m.header.group_id == kGroup && m.header.secret == kSecret);
    if (from_coordinator)
        MC_FUZZ_REQUIRE(m.header.sender_rank == kCoordinatorSender);
    else
        MC_FUZZ_REQUIRE(m.header.sender_rank < kSlots);
    auto back = parseControlMessage(serialize(m));
    MC_FUZZ_REQUIRE(back.ok() && back.value() == m);
}

bool sameView(const GroupView& a, const GroupView& b) {
    return a.epoch == b.epoch && a.revision == b.revision && a.bootstrapped == b.bootstrapped &&
           a.slots == b.slots;
}

struct Proc {
    uint32_t slot = 0;
    uint64_t nonce = 0;
    std::unique_ptr<MemberAgent> agent;
    std::deque<std::string> inbox;
    std::set<uint64_t> open;  // request ids issued and not completed
    uint64_t last_revision = 0;
    uint64_t last_epoch = 0;
    std::optional<ProbeLinks> probe;  // asked, not answered yet
};

class Sim {
public:
    explicit Sim(FailureMode mode) : mode_(mode) {
        CoordinatorConfig c;
        c.group_id = kGroup;
        c.secret = kSecret;
        c.max_group_size = kSlots;
        c.founding_size = kFounders;
        c.mode = mode;
        c.reconcile_window = Millis(1000);
        c.default_proposal_timeout = Millis(5000);
        c.default_join_timeout = Millis(20000);
        coord_ = std::make_unique<Coordinator>(std::move(Coordinator::create(c).value()));
        history_[0] = coord_->view();
        for (uint32_t s = 0; s < kSlots; ++s)
            spawn(s);
    }

    void step(FuzzInput& in) {
        switch (in.below(10)) {
            case 0:
            case 1:
                deliverToCoordinator(in.below(256));
                break;
            case 2:
            case 3:
                if (Proc* p = pick(in))
                    deliverToProc(*p, in.below(256));
                break;
            case 4:
                dropOrDuplicate(in);
                break;
            case 5: {
                static const int64_t kSteps[] = {1, 100, 999, 1001, 5000, 11000, 70000, 900000};
                advance(Millis(kSteps[in.below(std::size(kSteps))]));
                break;
            }
            case 6:
            case 7:
                if (Proc* p = pick(in))
                    command(*p, in);
                break;
            case 8:
                spawn(in.below(kSlots));
                break;
            default:
                if (procs_.size() > 1)
                    procs_.erase(procs_.begin() + in.below(static_cast<uint32_t>(procs_.size())));
                break;
        }
        checkProcs();
    }

    // A fair network for long enough that everything in flight lands and
    // every deadline passes; then no live process may wait on anything.
    void settle() {
        drain();
        advance(Millis(24LL * 3600 * 1000));
        drain();
        for (const auto& p : procs_) {
            MC_FUZZ_REQUIRE(p->open.empty());
            MC_FUZZ_REQUIRE(!p->agent->nextDeadline().has_value());
        }
    }

private:
    Proc* pick(FuzzInput& in) {
        if (procs_.empty())
            return nullptr;
        return procs_[in.below(static_cast<uint32_t>(procs_.size()))].get();
    }

    void spawn(uint32_t slot) {
        size_t in_slot = 0;
        for (const auto& p : procs_)
            in_slot += p->slot == slot;
        if (in_slot >= kMaxProcsPerSlot) {
            for (auto it = procs_.begin(); it != procs_.end(); ++it) {
                if ((*it)->slot == slot) {
                    procs_.erase(it);
                    break;
                }
            }
        }
        MemberAgentConfig c;
        c.group_id = kGroup;
        c.secret = kSecret;
        c.rank = slot;
        c.max_group_size = kSlots;
        c.is_extension = slot >= kFounders;
        c.nonce = ++next_nonce_;
        c.mode = mode_;
        c.register_timeout = Millis(10000);
        c.default_join_timeout = Millis(20000);
        c.default_proposal_timeout = Millis(5000);
        c.reply_grace = Millis(1000);
        auto p = std::make_unique<Proc>();
        p->slot = slot;
        p->nonce = c.nonce;
        p->agent = std::make_unique<MemberAgent>(std::move(MemberAgent::create(c).value()));
        procs_.push_back(std::move(p));
    }

    // The live process the Coordinator's host would send slot `rank` to: the
    // one holding the slot's incarnation, else the newest.
    Proc* holder(uint32_t rank) {
        Proc* newest = nullptr;
        for (auto& p : procs_) {
            if (p->slot != rank)
                continue;
            if (p->agent->registered() &&
                p->agent->incarnation() == coord_->view().slots[rank].incarnation)
                return p.get();
            newest = p.get();
        }
        return newest;
    }

    void runCoordinator(const CoordinatorEvent& e) {
        const GroupView before = coord_->view();
        auto effects = coord_->handle(e);
        const GroupView& after = coord_->view();
        MC_FUZZ_REQUIRE(after.slots.size() == kSlots);
        MC_FUZZ_REQUIRE(after.epoch >= before.epoch && after.revision >= before.revision);
        if (after.activeMask() != before.activeMask())
            MC_FUZZ_REQUIRE(after.epoch > before.epoch);
        if (after.revision != before.revision) {
            MC_FUZZ_REQUIRE(!history_.count(after.revision));
            history_[after.revision] = after;
        } else {
            MC_FUZZ_REQUIRE(sameView(after, before));
        }
        uint64_t commits = 0;
        std::vector<int32_t> last_mask;
        for (auto& eff : effects) {
            std::visit(Overloaded{
                           [&](const SendTo& s) {
                               MC_FUZZ_REQUIRE(s.rank < kSlots);
                               checkWellFormed(s.message, true);
                               route(s.rank, s.message);
                           },
                           [&](const Broadcast& b) {
                               checkWellFormed(b.message, true);
                               std::set<uint32_t> seen;
                               for (uint32_t r : b.ranks) {
                                   MC_FUZZ_REQUIRE(r < kSlots && seen.insert(r).second);
                                   route(r, b.message);
                               }
                           },
                           [&](const ViewCommitted& v) {
                               // One event may commit more than once (a
                               // resync, then a deactivation): each its own
                               // epoch, in order.
                               ++commits;
                               MC_FUZZ_REQUIRE(v.epoch == committed_ + 1);
                               MC_FUZZ_REQUIRE(v.group_size == groupSizeFromMask(v.active_mask));
                               committed_ = v.epoch;
                               last_mask = v.active_mask;
                           },
                           [&](const ProposalFailed& f) { MC_FUZZ_REQUIRE(f.proposer < kSlots); },
                           [&](const JoinFailed& f) { MC_FUZZ_REQUIRE(f.rank < kSlots); },
                           [&](const ReconciliationResult& r) {
                               for (uint32_t x : r.healthy)
                                   MC_FUZZ_REQUIRE(x < kSlots);
                               for (uint32_t x : r.unhealthy_active)
                                   MC_FUZZ_REQUIRE(x < kSlots);
                           },
                           [&](const Log&) {},
                       },
                       eff);
        }
        // Every epoch is announced, and the last announcement is the table.
        MC_FUZZ_REQUIRE(commits == after.epoch - before.epoch);
        if (commits > 0)
            MC_FUZZ_REQUIRE(last_mask == after.activeMask());
    }

    void route(uint32_t rank, const ControlMessage& m) {
        Proc* to = nullptr;
        if (auto* reply = std::get_if<RegisterReply>(&m.body)) {
            for (auto& p : procs_)
                if (p->nonce == reply->nonce)
                    to = p.get();
        } else {
            to = holder(rank);
        }
        if (to != nullptr)
            to->inbox.push_back(serialize(m));
    }

    void runAgent(Proc& p, const AgentEvent& e) {
        auto effects = p.agent->handle(e);
        for (auto& eff : effects) {
            std::visit(
                Overloaded{
                    [&](const SendToCoordinator& s) {
                        checkWellFormed(s.message, false);
                        MC_FUZZ_REQUIRE(s.message.header.sender_rank == p.slot);
                        coord_inbox_.push_back(serialize(s.message));
                    },
                    [&](const ProbeLinks& l) {
                        for (const auto& peer : l.peers)
                            MC_FUZZ_REQUIRE(peer.rank < kSlots);
                        p.probe = l;
                    },
                    [&](const ViewApplied& v) {
                        const GroupView& mine = p.agent->view();
                        MC_FUZZ_REQUIRE(v.revision > p.last_revision || p.last_revision == 0);
                        MC_FUZZ_REQUIRE(v.epoch >= p.last_epoch);
                        p.last_revision = v.revision;
                        p.last_epoch = v.epoch;
                        MC_FUZZ_REQUIRE(v.active_mask == p.agent->activeRanks());
                        auto it = history_.find(mine.revision);
                        MC_FUZZ_REQUIRE(it != history_.end() && sameView(it->second, mine));
                    },
                    [&](const OpCompleted& c) { MC_FUZZ_REQUIRE(p.open.erase(c.request_id) == 1); },
                    [&](const Log&) {},
                },
                eff);
        }
    }

    void deliverToCoordinator(size_t which) {
        if (coord_inbox_.empty())
            return;
        which %= coord_inbox_.size();
        std::string bytes = std::move(coord_inbox_[which]);
        coord_inbox_.erase(coord_inbox_.begin() + static_cast<std::ptrdiff_t>(which));
        runCoordinator(Received{now_, std::move(parseControlMessage(bytes)).value()});
    }

    void deliverToProc(Proc& p, size_t which) {
        if (p.inbox.empty())
            return;
        which %= p.inbox.size();
        std::string bytes = std::move(p.inbox[which]);
        p.inbox.erase(p.inbox.begin() + static_cast<std::ptrdiff_t>(which));
        runAgent(p, Received{now_, std::move(parseControlMessage(bytes)).value()});
    }

    void dropOrDuplicate(FuzzInput& in) {
        const bool dup = in.flag();
        std::deque<std::string>* q = &coord_inbox_;
        if (in.flag()) {
            Proc* p = pick(in);
            if (p == nullptr)
                return;
            q = &p->inbox;
        }
        if (q->empty())
            return;
        const size_t i = in.below(static_cast<uint32_t>(q->size()));
        if (dup)
            q->push_back((*q)[i]);
        else
            q->erase(q->begin() + static_cast<std::ptrdiff_t>(i));
    }

    void advance(Millis by) {
        now_ += by;
        runCoordinator(Tick{now_});
        for (size_t i = 0; i < procs_.size(); ++i)
            runAgent(*procs_[i], Tick{now_});
    }

    std::vector<uint32_t> ranks(FuzzInput& in) {
        std::vector<uint32_t> out;
        const uint8_t mask = in.u8();
        for (uint32_t r = 0; r < kSlots + 1; ++r)  // kSlots itself is out of range
            if (mask & (1u << r))
                out.push_back(r);
        return out;
    }

    // What a host's link probe would find: the truth, or a partition.
    std::vector<uint32_t> probeAnswer(Proc& p, FuzzInput* in) {
        std::vector<uint32_t> reached(kSlots, 0);
        const uint8_t cut = in ? in->u8() : 0;
        for (uint32_t r = 0; r < kSlots; ++r) {
            if (cut & (1u << r))
                continue;
            for (auto& q : procs_)
                if (q->slot == r && q->agent->registered() &&
                    q->agent->incarnation() == p.agent->view().slots[r].incarnation)
                    reached[r] = q->agent->incarnation();
        }
        return reached;
    }

    void command(Proc& p, FuzzInput& in) {
        const uint64_t id = ++next_request_;
        const Millis timeout(in.below(4) * 3000);
        switch (in.below(8)) {
            case 0:
                p.open.insert(id);
                runAgent(p, RegisterCmd{now_, id, in.flag() ? "ep" + std::to_string(p.slot) : ""});
                break;
            case 1:
                runAgent(p, PublishEndpointCmd{now_, "ep" + std::to_string(p.slot)});
                break;
            case 2:
                p.open.insert(id);
                runAgent(p, JoinGroupCmd{now_, id, timeout});
                break;
            case 3:
                p.open.insert(id);
                runAgent(p, ActivateRanksCmd{now_, id, ranks(in), timeout});
                break;
            case 4:
                p.open.insert(id);
                runAgent(p, DeactivateRanksCmd{now_, id, ranks(in)});
                break;
            case 5: {
                std::vector<uint8_t> hint;
                if (in.flag())
                    for (uint32_t r : ranks(in))
                        hint.resize(kSlots), hint[r % kSlots] = 1;
                p.open.insert(id);
                runAgent(p, SyncAfterFailureCmd{now_, id, in.flag(), hint});
                break;
            }
            case 6:
                runAgent(p, LinksProbedCmd{now_, probeAnswer(p, &in)});
                p.probe.reset();
                break;
            default:
                runAgent(p, LeaveCmd{now_});
                break;
        }
    }

    void drain() {
        for (int round = 0; round < 64; ++round) {
            bool moved = false;
            while (!coord_inbox_.empty()) {
                deliverToCoordinator(0);
                moved = true;
            }
            for (size_t i = 0; i < procs_.size(); ++i) {
                Proc& p = *procs_[i];
                while (!p.inbox.empty()) {
                    deliverToProc(p, 0);
                    moved = true;
                }
                if (p.probe) {
                    p.probe.reset();
                    runAgent(p, LinksProbedCmd{now_, probeAnswer(p, nullptr)});
                    moved = true;
                }
            }
            checkProcs();
            if (!moved)
                return;
        }
    }

    void checkProcs() {
        std::set<std::pair<uint32_t, uint64_t>> active_at;  // (slot, epoch)
        for (const auto& p : procs_) {
            MC_FUZZ_REQUIRE(p->agent->view().slots.size() == kSlots);
            if (p->agent->selfState() == GroupMemberState::kActive)
                MC_FUZZ_REQUIRE(active_at.insert({p->slot, p->agent->epoch()}).second);
        }
    }

    FailureMode mode_;
    std::unique_ptr<Coordinator> coord_;
    std::deque<std::string> coord_inbox_;
    std::vector<std::unique_ptr<Proc>> procs_;
    std::map<uint64_t, GroupView> history_;
    uint64_t committed_ = 0;
    uint64_t next_nonce_ = 0;
    uint64_t next_request_ = 0;
    Millis now_{0};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzInput in(data, size);
    static const FailureMode kModes[] = {{true, true}, {true, false}, {false, false}};
    Sim sim(kModes[in.below(3)]);
    for (int steps = 0; !in.done() && steps < 400; ++steps)
        sim.step(in);
    sim.settle();
    return 0;
}

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    // Bytes per step (see Sim::step and Sim::command): deliver to the
    // Coordinator {0, which}; deliver to a process {2, proc, which}; a
    // command {6, proc, timeout, kind, args...}; a tick {5, step}; a kill
    // {9, proc}. The first byte picks the failure mode.
    auto deliverAll = [](int rounds) {
        std::string s;
        for (int i = 0; i < rounds; ++i)
            s += std::string{0, 0, 2, static_cast<char>(i % 4), 0};
        return s;
    };
    auto cmd = [](char proc, std::string rest) { return std::string{6, proc, 0} + rest; };
    std::string boot = {0};
    for (char p = 0; p < 4; ++p)
        boot += cmd(p, {0, 1});  // register with an endpoint
    boot += deliverAll(40);
    std::string links;
    for (char p = 0; p < 4; ++p)
        links += cmd(p, {6, 0});  // answer probes truthfully
    std::string join = boot + links + deliverAll(20) + cmd(2, {2}) + cmd(3, {2}) + deliverAll(20);
    join += cmd(0, {3, 0x0c}) + deliverAll(30);  // rank 0 proposes 2 and 3
    std::string fail = boot + links + deliverAll(20) + std::string{9, 1};  // a founder dies
    fail += cmd(0, {5, 1, 0x02, 0});  // sync after failure, rank 1 suspected
    for (int i = 0; i < 30; ++i)
        fail += std::string{0, 0, 2, 0, 0, 5, 3} + cmd(static_cast<char>(i % 3), {6, 0});
    std::string replace = boot + links + deliverAll(20) + std::string{8, 1} + cmd(4, {0, 1}) +
                          deliverAll(40);  // a second process in slot 1
    return {boot, join, fail, replace};
}

}  // namespace mooncake::fuzz
