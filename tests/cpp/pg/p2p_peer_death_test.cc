// A P2P peer that delivered a message and then died: its receiver still
// completes the message, as a collective's peers do (fabric_wait.h), with
// host pools and with external ones (a P2PMover, as device pools). The
// receiver's progress thread is held where it asks whether the peer failed,
// so the message's last chunk and ack land before it learns of the death.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "tests/cpp/pg/collectives_test_util.h"
#include "tests/cpp/pg/p2p_fake_mover.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg {
namespace {

using namespace p2p_test;
using namespace std::chrono_literals;

// Reports `peer` failed once told to, and while held blocks whoever asks
// about it (the engine's progress thread, which asks before it reads what
// the peer wrote).
class HeldDeathFabric : public testutil::ForwardingFabric {
public:
    HeldDeathFabric(std::shared_ptr<Fabric> inner, int peer)
        : ForwardingFabric(std::move(inner)), peer_(peer) {}

    bool peerFailed(int peer) const override {
        if (peer != peer_)
            return ForwardingFabric::peerFailed(peer);
        std::unique_lock<std::mutex> lock(mu_);
        if (held_) {
            ++waiting_;
            cv_.notify_all();
            cv_.wait_for(lock, 20s, [&] { return !held_; });
            --waiting_;
        }
        return dead_;
    }
    void hold() {
        std::lock_guard<std::mutex> lock(mu_);
        held_ = true;
    }
    // Whether the progress thread is parked in peerFailed, within `limit`.
    bool awaitHeld(std::chrono::milliseconds limit) {
        std::unique_lock<std::mutex> lock(mu_);
        return cv_.wait_for(lock, limit, [&] { return waiting_ > 0; });
    }
    void dieAndRelease() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            dead_ = true;
            held_ = false;
        }
        cv_.notify_all();
    }

private:
    const int peer_;
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    mutable int waiting_ = 0;
    bool held_ = false;
    bool dead_ = false;
};

// Rank 0 sends three chunks to rank 1, whose progress thread is held where
// it asks about rank 0 until rank 0 has delivered them all and "died".
void expectDeliveredBeforeDeathCompletes(const P2POptions& o, bool external) {
    ThreadFabricGroup fabrics(2, o.window_offset + P2PEngine::windowBytesFor(2, o));
    auto receiver_fabric = std::make_shared<HeldDeathFabric>(fabrics.fabric(1), /*peer=*/0);
    auto pools = std::make_shared<FakePools>(2, o.pool_bytes_per_peer);
    std::unique_ptr<P2PEngine> sender_engine, receiver_engine;
    if (external) {
        sender_engine = std::make_unique<P2PEngine>(fabrics.fabric(0), o,
                                                    std::make_shared<FakeMover>(pools, 0));
        receiver_engine =
            std::make_unique<P2PEngine>(receiver_fabric, o, std::make_shared<FakeMover>(pools, 1));
    } else {
        sender_engine = std::make_unique<P2PEngine>(fabrics.fabric(0), o);
        receiver_engine = std::make_unique<P2PEngine>(receiver_fabric, o);
    }
    P2PEngine& sender = *sender_engine;
    P2PEngine& receiver = *receiver_engine;

    const auto want = pattern(3001, 7);  // three chunks of smallOptions()
    std::vector<uint8_t> got(want.size());
    const uint64_t passes = receiver.stats().progress_passes;
    auto r = postRecv(receiver, got, 0, 5);
    // A whole pass after the post has granted its credits (the pool holds
    // the whole message)...
    ASSERT_TRUE(eventually([&] { return receiver.stats().progress_passes >= passes + 2; }));
    // ...then the receiver stops just before it would read what comes.
    receiver_fabric->hold();
    ASSERT_TRUE(receiver_fabric->awaitHeld(10s));
    auto s = postSend(sender, want, 1, 5);
    ASSERT_TRUE(s->wait().ok());
    ASSERT_TRUE(sender.flushSends(Deadline::after(10s)).ok());  // every chunk put, acked
    // The sender dies with everything delivered; the receiver learns it
    // before it has read the acks.
    receiver_fabric->dieAndRelease();
    const Status st = r->wait();
    ASSERT_TRUE(st.ok()) << st.toString();
    EXPECT_EQ(got, want);
    // The pair is gone all the same: a new op with the dead peer fails.
    EXPECT_EQ(
        receiver.recv(got.data(), got.size(), 0, 6, Deadline::after(1s), [](Status) {}).code(),
        StatusCode::kPeerFailure);
}

TEST(P2PPeerDeath, AMessageDeliveredBeforeTheSenderDiedCompletes) {
    expectDeliveredBeforeDeathCompletes(smallOptions(), /*external=*/false);
}

// The same with the pools outside the window (device pools' mode): the
// copies out of the pool that the acks queue complete the recv first.
TEST(P2PPeerDeath, AMessageDeliveredBeforeTheSenderDiedCompletesWithExternalPools) {
    expectDeliveredBeforeDeathCompletes(externalOptions(), /*external=*/true);
}

}  // namespace
}  // namespace mooncake::pg
