// Inboxes over a store that offers only set/get/add/remove (what every c10d
// Store implements: FileStore has no queues): message numbering, order,
// deletion of what was read, a sender that died between its claim and its
// write, and the control-plane hosts running over such a store.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/control_plane/coordinator_host.h"
#include "mooncake-pg/control_plane/mailbox.h"
#include "mooncake-pg/control_plane/member_host.h"

namespace mooncake::pg::control_plane {
namespace {

using namespace std::chrono_literals;

// Forwards the four basic calls and records which keys exist, so a test can
// see what an inbox leaves behind. Nothing else: no queues of any kind.
class BasicStore final : public KVStore {
public:
    Status set(const std::string& key, const std::string& value) override {
        note(key, true);
        return inner_.set(key, value);
    }
    Result<std::string> get(const std::string& key, Deadline deadline) override {
        return inner_.get(key, deadline);
    }
    Result<int64_t> add(const std::string& key, int64_t delta) override {
        note(key, true);
        return inner_.add(key, delta);
    }
    Status remove(const std::string& key) override {
        note(key, false);
        return inner_.remove(key);
    }
    std::set<std::string> keys() const {
        std::lock_guard<std::mutex> lock(mu_);
        return keys_;
    }

private:
    void note(const std::string& key, bool present) {
        std::lock_guard<std::mutex> lock(mu_);
        if (present) {
            keys_.insert(key);
        } else {
            keys_.erase(key);
        }
    }
    InProcessKVStore inner_;
    mutable std::mutex mu_;
    std::set<std::string> keys_;
};

// Reads until a message arrives or `total` passes, in short slices like the
// hosts do (each slice's timeout is where the reader looks at holes).
Result<std::string> receiveWithin(InboxReader& reader, std::chrono::milliseconds total) {
    const Deadline overall = Deadline::after(total);
    while (true) {
        auto got = reader.receive(Deadline::after(5ms));
        if (got.ok() || got.status().code() != StatusCode::kTimeout || overall.expired())
            return got;
    }
}

TEST(InboxTest, ConcurrentSendersEachInOrderEveryMessageOnceAndReadKeysDeleted) {
    BasicStore store;
    Mailbox mail(&store, "pg/g");
    const std::string inbox = mail.coordinatorInbox();
    constexpr int kSenders = 4;
    constexpr int kEach = 50;
    std::vector<std::thread> senders;
    for (int s = 0; s < kSenders; ++s) {
        senders.emplace_back([&, s] {
            for (int i = 0; i < kEach; ++i)
                ASSERT_TRUE(
                    mail.sendBytes(inbox, std::to_string(s) + ":" + std::to_string(i)).ok());
        });
    }
    InboxReader reader(&store, inbox, 1h);
    std::map<int, int> next_of_sender;
    for (int n = 0; n < kSenders * kEach; ++n) {
        auto got = receiveWithin(reader, 10s);
        ASSERT_TRUE(got.ok()) << "message " << n << ": " << got.status().toString();
        const std::string& m = got.value();
        const int s = std::stoi(m.substr(0, m.find(':')));
        const int i = std::stoi(m.substr(m.find(':') + 1));
        EXPECT_EQ(i, next_of_sender[s]) << "sender " << s << " out of order";
        next_of_sender[s] = i + 1;
    }
    for (auto& t : senders)
        t.join();
    for (int s = 0; s < kSenders; ++s)
        EXPECT_EQ(next_of_sender[s], kEach) << "sender " << s;
    auto extra = reader.receive(Deadline::after(20ms));
    EXPECT_EQ(extra.status().code(), StatusCode::kTimeout) << extra.status().toString();
    // Only the counter remains: every message was deleted once read.
    EXPECT_EQ(store.keys(), std::set<std::string>{inbox + "/count"});
    EXPECT_EQ(reader.skipped(), 0u);
}

// A sender that died between its claim and its write holds up nobody: the
// messages after its number are read at once, long before the hole timeout.
TEST(InboxTest, MessagesAfterANumberADeadSenderClaimedAreReadAtOnce) {
    BasicStore store;
    Mailbox mail(&store, "pg/g");
    const std::string inbox = mail.processInbox(1, 0xabc);
    ASSERT_EQ(store.add(inbox + "/count", 1).value(), 1);
    ASSERT_TRUE(mail.sendBytes(inbox, "after the hole").ok());
    ASSERT_TRUE(mail.sendBytes(inbox, "and the next").ok());
    InboxReader reader(&store, inbox, 1h);
    for (const char* want : {"after the hole", "and the next"}) {
        auto got = reader.receive(Deadline::after(10s));
        ASSERT_TRUE(got.ok()) << got.status().toString();
        EXPECT_EQ(got.value(), want);
    }
    EXPECT_EQ(reader.skipped(), 0u);  // still hoping for number 1
}

TEST(InboxTest, NumberClaimedByADeadSenderIsGivenUpAfterTheHoleTimeout) {
    BasicStore store;
    Mailbox mail(&store, "pg/g");
    const std::string inbox = mail.processInbox(1, 0xabc);
    ASSERT_EQ(store.add(inbox + "/count", 1).value(), 1);
    InboxReader reader(&store, inbox, 50ms);
    const Deadline limit = Deadline::after(10s);
    while (reader.skipped() == 0) {
        ASSERT_FALSE(limit.expired()) << "the hole was never given up";
        auto got = reader.receive(Deadline::after(5ms));
        EXPECT_EQ(got.status().code(), StatusCode::kTimeout) << got.status().toString();
    }
    // A message written after the number was given up is not delivered as
    // a late one: the number is forgotten.
    ASSERT_TRUE(mail.sendBytes(inbox, "new").ok());
    auto got = receiveWithin(reader, 10s);
    ASSERT_TRUE(got.ok()) << got.status().toString();
    EXPECT_EQ(got.value(), "new");
    EXPECT_EQ(reader.skipped(), 1u);
}

// A live sender slow between its claim and its write loses nothing: the
// reader delivers what came after, then its message once written.
TEST(InboxTest, SlowSendersMessageIsDeliveredOnceWritten) {
    BasicStore store;
    Mailbox mail(&store, "pg/g");
    const std::string inbox = mail.processInbox(2, 0xdef);
    ASSERT_EQ(store.add(inbox + "/count", 1).value(), 1);
    ASSERT_TRUE(mail.sendBytes(inbox, "second").ok());
    InboxReader reader(&store, inbox, 1h);
    auto second = reader.receive(Deadline::after(10s));
    ASSERT_TRUE(second.ok()) << second.status().toString();
    EXPECT_EQ(second.value(), "second");
    auto none = reader.receive(Deadline::after(20ms));
    EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().toString();
    ASSERT_TRUE(store.set(inbox + "/1", "first").ok());
    auto first = receiveWithin(reader, 10s);
    ASSERT_TRUE(first.ok()) << first.status().toString();
    EXPECT_EQ(first.value(), "first");
    EXPECT_EQ(reader.skipped(), 0u);
    EXPECT_EQ(store.keys(), std::set<std::string>{inbox + "/count"});
}

// One sender's messages stay in order across holes: its earlier message,
// written late, is delivered before its later one.
TEST(InboxTest, OneSendersMessagesStayInOrderAcrossAHole) {
    BasicStore store;
    Mailbox mail(&store, "pg/g");
    const std::string inbox = mail.processInbox(3, 0x123);
    ASSERT_EQ(store.add(inbox + "/count", 1).value(), 1);  // sender A's claim
    InboxReader reader(&store, inbox, 1h);
    auto none = reader.receive(Deadline::after(20ms));  // number 1 becomes a hole
    EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().toString();
    // Sender A writes number 1, then sends again (number 2).
    ASSERT_TRUE(store.set(inbox + "/1", "A1").ok());
    ASSERT_TRUE(mail.sendBytes(inbox, "A2").ok());
    for (const char* want : {"A1", "A2"}) {
        auto got = reader.receive(Deadline::after(10s));
        ASSERT_TRUE(got.ok()) << got.status().toString();
        EXPECT_EQ(got.value(), want);
    }
}

// The whole control plane over a store without queues: bootstrap,
// deactivation and a join, as the torch layer drives them over a FileStore.
TEST(InboxTest, HostsBootstrapDeactivateAndJoinOverABasicStore) {
    BasicStore store;
    constexpr uint32_t kMax = 3;
    CoordinatorHostConfig cc;
    cc.coordinator.group_id = "g";
    cc.coordinator.secret = "s";
    cc.coordinator.max_group_size = kMax;
    cc.coordinator.founding_size = 2;
    cc.key_prefix = "pg/g";
    cc.poll_interval = 20ms;
    auto coord = CoordinatorHost::start(cc, &store);
    ASSERT_TRUE(coord.ok()) << coord.status().toString();

    std::vector<std::unique_ptr<MemberHost>> hosts;
    for (uint32_t r = 0; r < kMax; ++r) {
        MemberHostConfig mc;
        mc.agent.group_id = "g";
        mc.agent.secret = "s";
        mc.agent.rank = r;
        mc.agent.max_group_size = kMax;
        mc.agent.is_extension = r == 2;
        mc.agent.register_timeout = 10s;
        mc.key_prefix = "pg/g";
        mc.poll_interval = 20ms;
        mc.probe_timeout = 200ms;
        auto h = MemberHost::create(mc, &store, {});
        ASSERT_TRUE(h.ok()) << h.status().toString();
        hosts.push_back(std::move(h).value());
    }
    const auto endpoint = [](uint32_t r) { return "tcp://127.0.0.1:" + std::to_string(7000 + r); };
    std::vector<Status> started(2);
    {
        std::thread t1([&] { started[1] = hosts[1]->start(endpoint(1), Deadline::after(10s)); });
        started[0] = hosts[0]->start(endpoint(0), Deadline::after(10s));
        t1.join();
    }
    ASSERT_TRUE(started[0].ok()) << started[0].toString();
    ASSERT_TRUE(started[1].ok()) << started[1].toString();
    EXPECT_EQ(hosts[0]->activeRanks(), (std::vector<int32_t>{1, 1, 0}));

    Status st = hosts[2]->start(endpoint(2), Deadline::after(10s));
    ASSERT_TRUE(st.ok()) << st.toString();
    Status joined;
    std::thread joiner([&] { joined = hosts[2]->joinGroup(Deadline::after(10s)); });
    st = hosts[0]->awaitView(
        [](const GroupView& v) {
            const SlotInfo& s = v.slots[2];
            return s.member == GroupMemberState::kAwaitingActivation &&
                   s.rank == RankState::kHealthy && !s.endpoint.empty();
        },
        Deadline::after(10s));
    ASSERT_TRUE(st.ok()) << st.toString();
    st = hosts[0]->activateRanks({2}, Deadline::after(10s));
    joiner.join();
    ASSERT_TRUE(st.ok()) << st.toString();
    ASSERT_TRUE(joined.ok()) << joined.toString();
    EXPECT_EQ(hosts[2]->activeRanks(), (std::vector<int32_t>{1, 1, 1}));

    st = hosts[0]->deactivateRanks({1}, Deadline::after(10s));
    ASSERT_TRUE(st.ok()) << st.toString();
    for (uint32_t r : {0u, 2u}) {
        st = hosts[r]->awaitView([](const GroupView& v) { return !v.isActive(1); },
                                 Deadline::after(10s));
        EXPECT_TRUE(st.ok()) << "rank " << r << ": " << st.toString();
    }
    for (auto& h : hosts)
        h->stop();
    (*coord)->stop();
}

}  // namespace
}  // namespace mooncake::pg::control_plane
