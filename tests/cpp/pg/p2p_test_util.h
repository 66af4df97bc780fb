// Helpers shared by the P2PEngine tests: a group of engines over a
// ThreadFabricGroup, completions to wait on, byte patterns.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/p2p.h"

namespace mooncake::pg::p2p_test {

using namespace std::chrono_literals;

// Small pools and rings so that a few KiB exercise chunking, pool reuse and
// ring wrap-around. A non-zero window offset checks the layout arithmetic.
inline P2POptions smallOptions() {
    P2POptions o;
    o.pool_bytes_per_peer = 4096;
    o.chunk_bytes = 1024;
    o.ring_slots = 4;
    o.window_offset = 128;
    return o;
}

// Message sizes around smallOptions()'s chunk (1 KiB) and pool (4 KiB).
inline const std::vector<size_t> kSizes = {0, 1, 7, 1023, 1024, 1025, 3001, 4096, 3 * 4096 + 17};

// Collects one completion; shared with the callback so a late kAborted from
// an engine's destructor never touches a dead object.
class Completion {
public:
    static std::shared_ptr<Completion> make() { return std::make_shared<Completion>(); }

    static P2PEngine::Callback callback(const std::shared_ptr<Completion>& c) {
        return [c](Status s) {
            std::lock_guard<std::mutex> lock(c->mu_);
            EXPECT_FALSE(c->status_.has_value()) << "callback fired twice";
            c->status_ = std::move(s);
            c->cv_.notify_all();
        };
    }

    // The status, or Internal if no callback came within `limit` (a hang).
    Status wait(std::chrono::milliseconds limit = 20s) {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_for(lock, limit, [this] { return status_.has_value(); })) {
            return Internal("no completion within " + std::to_string(limit.count()) + " ms");
        }
        return *status_;
    }

    bool done() {
        std::lock_guard<std::mutex> lock(mu_);
        return status_.has_value();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<Status> status_;
};

struct Group {
    Group(int n, const P2POptions& o)
        : options(o), fabrics(n, o.window_offset + P2PEngine::windowBytesFor(n, o)) {
        for (int r = 0; r < n; ++r) {
            engines.push_back(std::make_unique<P2PEngine>(fabrics.fabric(r), o));
        }
    }
    P2PEngine& operator[](int r) { return *engines[r]; }

    P2POptions options;
    ThreadFabricGroup fabrics;
    std::vector<std::unique_ptr<P2PEngine>> engines;
};

inline std::vector<uint8_t> pattern(size_t bytes, int seed) {
    std::vector<uint8_t> v(bytes);
    for (size_t i = 0; i < bytes; ++i)
        v[i] = static_cast<uint8_t>(i * 131 + seed * 17 + i / 251);
    return v;
}

inline std::shared_ptr<Completion> postSend(P2PEngine& e, const std::vector<uint8_t>& buf, int peer,
                                            int tag, Deadline d = Deadline::after(20s)) {
    auto c = Completion::make();
    auto done = Completion::callback(c);
    Status st = e.send(buf.data(), buf.size(), peer, tag, d, done);
    EXPECT_TRUE(st.ok()) << st.toString();
    if (!st.ok())
        done(st);  // report the rejection instead of hanging in wait()
    return c;
}

inline std::shared_ptr<Completion> postRecv(P2PEngine& e, std::vector<uint8_t>& buf, int peer,
                                            int tag, Deadline d = Deadline::after(20s)) {
    auto c = Completion::make();
    auto done = Completion::callback(c);
    Status st = e.recv(buf.data(), buf.size(), peer, tag, d, done);
    EXPECT_TRUE(st.ok()) << st.toString();
    if (!st.ok())
        done(st);
    return c;
}

// Waits (bounded) until `pred` holds; for conditions another thread makes true.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit = 10s) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
        if (std::chrono::steady_clock::now() > until)
            return false;
        std::this_thread::yield();
    }
    return true;
}

// Sends `bytes` of pattern(seed) from g[from] to g[to] on `tag`; both sides
// must succeed and the bytes arrive exactly.
template <typename Engines>
void expectDelivered(Engines& g, int from, int to, int tag, size_t bytes, int seed) {
    auto want = pattern(bytes, seed);
    std::vector<uint8_t> got(bytes);
    auto s = postSend(g[from], want, to, tag);
    ASSERT_TRUE(postRecv(g[to], got, from, tag)->wait().ok());
    EXPECT_TRUE(s->wait().ok());
    EXPECT_EQ(got, want);
}

// A 6000-byte send from g[1] meets a 5000-byte recv on g[0]: both fail
// naming the two sizes, and the pair and the tag stay usable.
template <typename Engines>
void expectSizeMismatchFailsBothSides(Engines& g) {
    auto want = pattern(6000, 1);
    std::vector<uint8_t> got(5000);
    auto r = postRecv(g[0], got, 1, 2);
    auto s = postSend(g[1], want, 0, 2);
    Status rs = r->wait(), ss = s->wait();
    EXPECT_EQ(rs.code(), StatusCode::kInvalidArgument) << rs.toString();
    EXPECT_EQ(ss.code(), StatusCode::kInvalidArgument) << ss.toString();
    for (const Status* st : {&rs, &ss}) {
        EXPECT_NE(st->message().find("6000"), std::string::npos) << st->toString();
        EXPECT_NE(st->message().find("5000"), std::string::npos) << st->toString();
    }
    auto again = pattern(5000, 2);
    auto s2 = postSend(g[1], again, 0, 2);
    ASSERT_TRUE(postRecv(g[0], got, 1, 2)->wait().ok());
    EXPECT_TRUE(s2->wait().ok());
    EXPECT_EQ(got, again);
}

inline void runRanks(int n, const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
        threads.emplace_back(body, r);
    for (auto& t : threads)
        t.join();
}

}  // namespace mooncake::pg::p2p_test
