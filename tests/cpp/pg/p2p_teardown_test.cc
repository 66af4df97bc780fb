// P2PEngine destroyed from one of its own completion callbacks (the last
// owner lets go on the progress thread): no self-join, the callback's
// operation completes, and the engine's other pending operations are aborted.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "mooncake-pg/core/p2p.h"
#include "tests/cpp/pg/p2p_test_util.h"

namespace mooncake::pg {
namespace {

using namespace p2p_test;
using namespace std::chrono_literals;

TEST(P2PTeardown, EngineDestroyedInItsOwnCallback) {
    // Leaked on purpose: the handed-off engine ends on a thread of its own,
    // after its last completion, so its fabric must outlive the test body.
    auto* g = new Group(2, smallOptions());
    std::vector<uint8_t> other(10);
    auto pending = postRecv((*g)[0], other, 1, 99, Deadline::after(20s));

    std::unique_ptr<P2PEngine> engine = std::move(g->engines[0]);
    auto done = Completion::make();
    auto report = Completion::callback(done);
    std::vector<uint8_t> got(100);
    Status st = engine->recv(got.data(), got.size(), 1, 5, Deadline::after(20s),
                             [&engine, report](Status s) {
                                 engine.reset();  // on the progress thread
                                 report(std::move(s));
                             });
    ASSERT_TRUE(st.ok()) << st.toString();
    auto want = pattern(100, 1);
    auto sent = postSend((*g)[1], want, 0, 5);
    ASSERT_TRUE(done->wait().ok());
    EXPECT_EQ(got, want);
    EXPECT_TRUE(sent->wait().ok());
    EXPECT_EQ(pending->wait().code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace mooncake::pg
