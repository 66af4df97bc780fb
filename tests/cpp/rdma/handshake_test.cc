// The store handshake without a NIC: requests reach the acceptor in order,
// replies reach the right requester, refusals and silence become errors
// within the deadline, and a slot abandoned by a dead requester is skipped.
#include <thread>

#include <gtest/gtest.h>

#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/rdma/handshake.h"

namespace mooncake::te::rdma {
namespace {

QpMessage requestWith(uint32_t qpn, uint64_t nonce) {
    QpMessage m;
    m.nonce = nonce;
    m.address.qpn = qpn;
    m.address.psn = 5;
    m.address.mtu = 3;
    return m;
}

TEST(Handshake, RequestAndReply) {
    auto store = std::make_shared<InProcessKVStore>();
    Handshake a(store.get(), "p", "a");
    Handshake b(store.get(), "p", "b");
    std::thread acceptor([&] {
        auto req = b.nextRequest(Deadline::afterMs(10000));
        ASSERT_TRUE(req.ok()) << req.status().toString();
        EXPECT_EQ(req->from, "a");
        EXPECT_EQ(req->kind, QpMessage::kRequest);
        EXPECT_EQ(req->address.qpn, 17u);
        QpMessage reply = requestWith(99, req->nonce);
        ASSERT_TRUE(b.reply(req->from, reply).ok());
    });
    auto reply = a.request("b", requestWith(17, 1234), Deadline::afterMs(10000));
    acceptor.join();
    ASSERT_TRUE(reply.ok()) << reply.status().toString();
    EXPECT_EQ(reply->kind, QpMessage::kReply);
    EXPECT_EQ(reply->from, "b");
    EXPECT_EQ(reply->nonce, 1234u);
    EXPECT_EQ(reply->address.qpn, 99u);
    // Consumed: the slot and the reply are gone from the store.
    EXPECT_EQ(store->get(a.inboxSlotKey("b", 1), Deadline::afterMs(0)).status().code(),
              StatusCode::kTimeout);
    EXPECT_EQ(store->get(a.replyKey("a", 1234), Deadline::afterMs(0)).status().code(),
              StatusCode::kTimeout);
}

TEST(Handshake, RequestsArriveInOrder) {
    auto store = std::make_shared<InProcessKVStore>();
    Handshake x(store.get(), "p", "x"), y(store.get(), "p", "y"), b(store.get(), "p", "b");
    // Requests written without waiting for replies (the replies are not read).
    ASSERT_TRUE(store->add(x.inboxCounterKey("b"), 1).ok());
    ASSERT_TRUE(store
                    ->set(x.inboxSlotKey("b", 1),
                          [] {
                              QpMessage m = requestWith(1, 11);
                              m.from = "x";
                              return m.serialize();
                          }())
                    .ok());
    ASSERT_TRUE(store->add(y.inboxCounterKey("b"), 1).ok());
    ASSERT_TRUE(store
                    ->set(y.inboxSlotKey("b", 2),
                          [] {
                              QpMessage m = requestWith(2, 22);
                              m.from = "y";
                              return m.serialize();
                          }())
                    .ok());
    auto first = b.nextRequest(Deadline::afterMs(5000));
    auto second = b.nextRequest(Deadline::afterMs(5000));
    ASSERT_TRUE(first.ok() && second.ok());
    EXPECT_EQ(first->from, "x");
    EXPECT_EQ(second->from, "y");
    EXPECT_EQ(b.nextRequest(Deadline::afterMs(50)).status().code(), StatusCode::kTimeout);
}

TEST(Handshake, SilentPeerTimesOut) {
    auto store = std::make_shared<InProcessKVStore>();
    Handshake a(store.get(), "p", "a");
    auto reply = a.request("nobody", requestWith(3, 7), Deadline::afterMs(100));
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), StatusCode::kTimeout);
    EXPECT_NE(reply.status().message().find("segment nobody did not answer"), std::string::npos)
        << reply.status().message();
}

TEST(Handshake, RefusalIsPeerFailureWithTheReason) {
    auto store = std::make_shared<InProcessKVStore>();
    Handshake a(store.get(), "p", "a");
    Handshake b(store.get(), "p", "b");
    std::thread acceptor([&] {
        auto req = b.nextRequest(Deadline::afterMs(10000));
        ASSERT_TRUE(req.ok());
        QpMessage refusal;
        refusal.nonce = req->nonce;
        refusal.error = "ibv_create_qp failed: ENOMEM";
        ASSERT_TRUE(b.reply(req->from, refusal).ok());
    });
    auto reply = a.request("b", requestWith(3, 8), Deadline::afterMs(10000));
    acceptor.join();
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), StatusCode::kPeerFailure);
    EXPECT_EQ(reply.status().message(),
              "rdma handshake: segment b refused: ibv_create_qp failed: ENOMEM");
}

TEST(Handshake, AbandonedSlotIsSkipped) {
    auto store = std::make_shared<InProcessKVStore>();
    Handshake b(store.get(), "p", "b", /*abandon_after_ms=*/150);
    Handshake late(store.get(), "p", "late");
    // Slot 1 reserved by a requester that died before writing it.
    ASSERT_EQ(store->add(b.inboxCounterKey("b"), 1).value(), 1);
    ASSERT_EQ(store->add(b.inboxCounterKey("b"), 1).value(), 2);
    QpMessage m = requestWith(4, 44);
    m.from = "late";
    ASSERT_TRUE(store->set(b.inboxSlotKey("b", 2), m.serialize()).ok());
    auto req = b.nextRequest(Deadline::afterMs(5000));
    ASSERT_TRUE(req.ok()) << req.status().toString();
    EXPECT_EQ(req->from, "late");
}

TEST(Handshake, GarbageInASlotIsReportedAndConsumed) {
    auto store = std::make_shared<InProcessKVStore>();
    Handshake b(store.get(), "p", "b");
    ASSERT_TRUE(store->add(b.inboxCounterKey("b"), 1).ok());
    ASSERT_TRUE(store->set(b.inboxSlotKey("b", 1), "garbage").ok());
    auto bad = b.nextRequest(Deadline::afterMs(1000));
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.status().message(), "rdma inbox slot 1: not an rdma QP message (bad magic)");
    EXPECT_EQ(b.nextRequest(Deadline::afterMs(50)).status().code(), StatusCode::kTimeout);
}

}  // namespace
}  // namespace mooncake::te::rdma
