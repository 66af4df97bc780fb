// TCP transport end to end. Targets run in forked child processes that share
// their registered region with the parent through a MAP_SHARED mapping, so
// the parent can check byte for byte what the transport wrote there (and
// prepare what a READ must return) without using the transport itself.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "tests/cpp/te/tcp_test_util.h"

namespace mooncake::te {
namespace {

using namespace std::chrono_literals;
using test::Child;
using test::fillPattern;
using test::findMismatch;
using test::Mapping;
using test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

// A target engine in a child process whose registered region is `region`
// (shared with the parent). It serves until told to stop or killed.
class ChildTarget {
public:
    ChildTarget(const std::string& dir, const std::string& name, const std::string& secret,
                Mapping* region)
        : dir_(dir),
          name_(name),
          child_([this, secret, region] { return serve(secret, region); }) {}
    ~ChildTarget() { (void)stop(); }

    bool started() const { return child_.ok(); }
    Status waitReady() {
        FileKVStore store(dir_);
        return store.get("ready/" + name_, Deadline::afterMs(30000)).status();
    }
    // SIGSTOP, returning once the child is really stopped.
    void freeze() { (void)child_.stop(); }
    void thaw() { child_.kill(SIGCONT); }
    void killAndReap() {
        child_.kill(SIGKILL);
        (void)child_.wait(Deadline::never());
    }
    // Asks the child to exit and returns what Child::wait does (-1: it did
    // not exit in time and was killed, or was never started or already reaped).
    int stop() {
        if (!child_.ok() || child_.reaped())
            return -1;
        FileKVStore store(dir_);
        (void)store.set("stop/" + name_, "1");
        const int code = child_.wait(Deadline::afterMs(20000));
        if (code < 0)
            killAndReap();
        return code;
    }

private:
    int serve(const std::string& secret, Mapping* region) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
        auto store = std::make_shared<FileKVStore>(dir_);
        EngineOptions opts;
        opts.store = store;
        opts.segment_name = name_;
        opts.secret = secret;
        opts.force_tcp = true;
        TransferEngine engine(opts);
        if (!engine.init("127.0.0.1", {}).ok())
            return 2;
        if (!engine.registerLocalMemory(region->data(), region->size()).ok())
            return 3;
        if (!store->set("ready/" + name_, "1").ok())
            return 4;
        if (!store->get("stop/" + name_, Deadline::afterMs(120000)).ok())
            return 5;
        engine.shutdown();
        return 0;
    }

    std::string dir_;
    std::string name_;
    Child child_;  // after dir_ and name_: the child's body reads them
};

// The parent's engine plus one child target, both on tcp.
class TcpEngineTest : public ::testing::Test {
protected:
    // Must run before anything creates threads in this process: it forks.
    void startPair(size_t target_bytes, size_t local_bytes, const std::string& target_secret = "s",
                   const std::string& local_secret = "s") {
        remote_ = std::make_unique<Mapping>(target_bytes, true);
        local_ = std::make_unique<Mapping>(local_bytes, false);
        ASSERT_TRUE(remote_->ok() && local_->ok());
        child_ = std::make_unique<ChildTarget>(dir_.path(), "target", target_secret, remote_.get());
        ASSERT_TRUE(child_->started());
        ASSERT_TRUE(child_->waitReady().ok()) << "child target did not come up";

        EngineOptions opts;
        opts.store = std::make_shared<FileKVStore>(dir_.path());
        opts.segment_name = "initiator";
        opts.secret = local_secret;
        opts.force_tcp = true;
        engine_ = std::make_unique<TransferEngine>(opts);
        ASSERT_TRUE(engine_->init("127.0.0.1", {}).ok());
        ASSERT_TRUE(engine_->registerLocalMemory(local_->data(), local_->size()).ok());
        auto seg = engine_->openSegment("target", Deadline::afterMs(10000));
        ASSERT_TRUE(seg.ok()) << seg.status().toString();
        seg_ = seg.value();
        auto transport = engine_->transportFor(seg_, remoteAddr(0), 1);
        ASSERT_TRUE(transport.ok());
        ASSERT_EQ(transport.value(), "tcp");
    }

    void TearDown() override {
        if (engine_)
            engine_->shutdown();
        if (child_) {
            int code = child_->stop();
            // A killed child has been reaped already and reports -1.
            if (!killed_) {
                EXPECT_EQ(code, 0) << "child target exited abnormally";
            }
        }
    }

    uint64_t remoteAddr(uint64_t off) const {
        return reinterpret_cast<uint64_t>(remote_->data()) + off;
    }
    uint8_t* localPtr(uint64_t off) const { return local_->bytes() + off; }

    TransferRequest write(uint64_t local_off, uint64_t remote_off, uint64_t len) const {
        return {TransferOpcode::kWrite, localPtr(local_off), seg_, remoteAddr(remote_off), len};
    }
    TransferRequest read(uint64_t local_off, uint64_t remote_off, uint64_t len) const {
        return {TransferOpcode::kRead, localPtr(local_off), seg_, remoteAddr(remote_off), len};
    }

    // Submits `reqs` as one batch and waits; returns the batch outcome.
    Status run(const std::vector<TransferRequest>& reqs, Deadline deadline) {
        auto batch = engine_->allocateBatchID(reqs.size());
        if (!batch.ok())
            return batch.status();
        MC_RETURN_IF_ERROR(engine_->submitTransfer(batch.value(), reqs));
        Status st = engine_->waitBatch(batch.value(), deadline);
        if (st.ok())
            (void)engine_->freeBatchID(batch.value());
        return st;
    }

    // Waits until every request of `batch` left PENDING; false on deadline.
    bool waitAllDone(BatchID batch, size_t n, Deadline deadline) {
        for (size_t i = 0; i < n; ++i) {
            while (true) {
                auto s = engine_->getTransferStatus(batch, i);
                if (!s.ok())
                    return false;
                if (s->state != TransferState::kPending)
                    break;
                if (deadline.expired())
                    return false;
                std::this_thread::sleep_for(100us);
            }
        }
        return true;
    }

    TempDir dir_;
    std::unique_ptr<Mapping> remote_;
    std::unique_ptr<Mapping> local_;
    std::unique_ptr<ChildTarget> child_;
    std::unique_ptr<TransferEngine> engine_;
    SegmentID seg_ = -1;
    bool killed_ = false;
};

// ---- byte-exact WRITE and READ across sizes ----------------------------------------

class TcpSizeTest : public TcpEngineTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(TcpSizeTest, WriteThenReadIsByteExact) {
    const uint64_t len = GetParam();
    // Odd offsets on both sides so nothing relies on alignment.
    const uint64_t src_off = 3, dst_off = 13, guard = 64;
    startPair(len + dst_off + guard, 2 * (len + guard));
    const uint32_t seed = static_cast<uint32_t>(len * 7 + 1);

    // WRITE: local pattern -> remote; the guard bytes around it stay zero.
    fillPattern(localPtr(src_off), len, seed);
    ASSERT_TRUE(run({write(src_off, dst_off, len)}, Deadline::afterMs(60000)).ok());
    EXPECT_EQ(findMismatch(remote_->bytes() + dst_off, len, seed), -1);
    for (uint64_t i = 0; i < dst_off; ++i)
        ASSERT_EQ(remote_->bytes()[i], 0) << i;
    for (uint64_t i = 0; i < guard; ++i)
        ASSERT_EQ(remote_->bytes()[dst_off + len + i], 0) << i;

    // READ: a different remote pattern -> a different, odd local offset.
    const uint64_t read_off = len + guard + 5;
    fillPattern(remote_->bytes() + dst_off, len, seed ^ 0x5a5a5a5a);
    ASSERT_TRUE(run({read(read_off, dst_off, len)}, Deadline::afterMs(60000)).ok());
    EXPECT_EQ(findMismatch(localPtr(read_off), len, seed ^ 0x5a5a5a5a), -1);
    EXPECT_EQ(localPtr(read_off)[-1], 0);
    if (read_off + len < local_->size()) {
        EXPECT_EQ(localPtr(read_off)[len], 0);
    }
}

INSTANTIATE_TEST_SUITE_P(Sizes, TcpSizeTest,
                         ::testing::Values(1, 7, 4096 + 3, kMiB + 1, 64 * kMiB, 256 * kMiB),
                         [](const auto& info) { return "Bytes" + std::to_string(info.param); });

// ---- many requests in flight --------------------------------------------------------

TEST_F(TcpEngineTest, FiveHundredConcurrentRequestsInOneBatch) {
    constexpr size_t kCount = 500, kStride = 9000;
    startPair(kCount * kStride, 2 * kCount * kStride);
    auto sizeOf = [](size_t i) { return 1 + (i * 37) % (kStride - 1); };
    std::vector<TransferRequest> writes, reads;
    for (size_t i = 0; i < kCount; ++i) {
        fillPattern(localPtr(i * kStride), sizeOf(i), static_cast<uint32_t>(i));
        writes.push_back(write(i * kStride, i * kStride + 1, sizeOf(i)));
    }
    ASSERT_TRUE(run(writes, Deadline::afterMs(30000)).ok());
    for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(findMismatch(remote_->bytes() + i * kStride + 1, sizeOf(i), i), -1) << i;
    }
    const uint64_t base = kCount * kStride;
    for (size_t i = 0; i < kCount; ++i)
        reads.push_back(read(base + i * kStride, i * kStride + 1, sizeOf(i)));
    ASSERT_TRUE(run(reads, Deadline::afterMs(30000)).ok());
    for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(findMismatch(localPtr(base + i * kStride), sizeOf(i), i), -1) << i;
    }
}

// The layer above publishes data with a WRITE and then raises a flag with a
// second small WRITE; the flag must never be visible before the data.
TEST_F(TcpEngineTest, FlagWriteLandsAfterItsDataWrite) {
    const uint64_t len = 16 * kMiB;
    startPair(len + 64, len + 64);
    for (uint32_t round = 1; round <= 4; ++round) {
        fillPattern(localPtr(0), len, round);
        std::memcpy(localPtr(len), &round, sizeof(round));
        auto batch = engine_->allocateBatchID(2);
        ASSERT_TRUE(batch.ok());
        ASSERT_TRUE(
            engine_->submitTransfer(batch.value(), {write(0, 0, len), write(len, len, 4)}).ok());
        // Watch the flag from here, as the target's consumer would.
        auto* flag = reinterpret_cast<volatile uint32_t*>(remote_->bytes() + len);
        Deadline d = Deadline::afterMs(30000);
        while (*flag != round && !d.expired())
            std::this_thread::yield();
        ASSERT_EQ(*flag, round);
        ASSERT_EQ(findMismatch(remote_->bytes(), len, round), -1) << "flag overtook data";
        ASSERT_TRUE(engine_->waitBatch(batch.value(), Deadline::afterMs(30000)).ok());
        ASSERT_TRUE(engine_->freeBatchID(batch.value()).ok());
    }
}

// waitBatch sleeps until a completion wakes it: several threads on each of
// several batches must all return, none may miss the wakeup of a completion
// that lands while it blocks, and the deadline still ends a wait.
TEST_F(TcpEngineTest, ManyWaitersOnManyBatchesWakeUpAndHonorTheDeadline) {
    constexpr int kBatches = 8, kPerBatch = 4, kWaiters = 3;
    const uint64_t len = kMiB;
    startPair(kBatches * kPerBatch * len, kBatches * kPerBatch * len);
    ASSERT_TRUE(run({write(0, 0, 4096)}, Deadline::afterMs(10000)).ok());  // connection is up

    // Nothing completes until the child runs again, so every waiter blocks.
    child_->freeze();
    std::vector<BatchID> batches;
    for (int b = 0; b < kBatches; ++b) {
        std::vector<TransferRequest> reqs;
        for (int i = 0; i < kPerBatch; ++i) {
            const uint64_t off = (b * kPerBatch + i) * len;
            fillPattern(localPtr(off), len, static_cast<uint32_t>(b * kPerBatch + i));
            reqs.push_back(write(off, off, len));
        }
        auto batch = engine_->allocateBatchID(kPerBatch);
        ASSERT_TRUE(batch.ok());
        ASSERT_TRUE(engine_->submitTransfer(batch.value(), reqs).ok());
        batches.push_back(batch.value());
    }
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(engine_->waitBatch(batches[0], Deadline::afterMs(200)).code(), StatusCode::kTimeout);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms);

    std::vector<Status> results(kBatches * kWaiters);
    std::vector<std::thread> waiters;
    for (int b = 0; b < kBatches; ++b) {
        for (int w = 0; w < kWaiters; ++w) {
            waiters.emplace_back([&, b, w] {
                results[b * kWaiters + w] =
                    engine_->waitBatch(batches[b], Deadline::afterMs(30000));
            });
        }
    }
    std::this_thread::sleep_for(100ms);  // let them block
    auto thawed = std::chrono::steady_clock::now();
    child_->thaw();
    for (auto& t : waiters)
        t.join();
    // Far below the 30 s deadline: they were woken, not timed out.
    EXPECT_LT(std::chrono::steady_clock::now() - thawed, 10s);
    for (size_t i = 0; i < results.size(); ++i)
        EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].toString();
    for (int i = 0; i < kBatches * kPerBatch; ++i) {
        ASSERT_EQ(findMismatch(remote_->bytes() + i * len, len, static_cast<uint32_t>(i)), -1) << i;
    }
    for (BatchID b : batches)
        EXPECT_TRUE(engine_->freeBatchID(b).ok());
}

// ---- failures -----------------------------------------------------------------------

TEST_F(TcpEngineTest, KilledPeerFailsEveryInFlightRequestPromptly) {
    const uint64_t len = 32 * kMiB;
    constexpr int kCount = 8;
    startPair(kCount * len, kCount * len);
    ASSERT_TRUE(run({write(0, 0, 4096)}, Deadline::afterMs(10000)).ok());  // connection is up

    // Freeze the child so nothing can complete, fill the pipe, then kill it.
    child_->freeze();
    std::vector<TransferRequest> reqs;
    for (int i = 0; i < kCount; ++i) {
        reqs.push_back(i % 2 ? read(i * len, i * len, len) : write(i * len, i * len, len));
    }
    auto batch = engine_->allocateBatchID(reqs.size());
    ASSERT_TRUE(batch.ok());
    ASSERT_TRUE(engine_->submitTransfer(batch.value(), reqs).ok());
    for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(engine_->getTransferStatus(batch.value(), i)->state, TransferState::kPending);
    }
    auto t0 = std::chrono::steady_clock::now();
    child_->killAndReap();
    killed_ = true;

    // Far below the 30 s request timeout: failure comes from the reset.
    Status st = engine_->waitBatch(batch.value(), Deadline::afterMs(5000));
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.code(), StatusCode::kTimeout) << st.toString();
    ASSERT_TRUE(waitAllDone(batch.value(), reqs.size(), Deadline::afterMs(5000)));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    for (size_t i = 0; i < reqs.size(); ++i) {
        auto s = engine_->getTransferStatus(batch.value(), i);
        ASSERT_TRUE(s.ok());
        EXPECT_EQ(s->state, TransferState::kFailed) << i;
        EXPECT_EQ(s->error.code(), StatusCode::kPeerFailure) << s->error.toString();
        EXPECT_NE(s->error.message().find("target"), std::string::npos) << s->error.toString();
    }
    EXPECT_TRUE(engine_->freeBatchID(batch.value()).ok());
}

TEST_F(TcpEngineTest, BadRequestsAreRefusedAndWriteNothing) {
    const uint64_t len = 64 * 1024;
    startPair(len, len);
    std::memset(remote_->data(), 0xAB, len);
    fillPattern(localPtr(0), len, 9);
    auto expectRefused = [&](std::vector<TransferRequest> reqs, StatusCode code) {
        auto batch = engine_->allocateBatchID(reqs.size());
        ASSERT_TRUE(batch.ok());
        Status st = engine_->submitTransfer(batch.value(), reqs);
        EXPECT_EQ(st.code(), code) << st.toString();
        EXPECT_TRUE(engine_->freeBatchID(batch.value()).ok());
    };
    std::vector<uint8_t> unregistered(4096, 1);
    TransferRequest bad_src = write(0, 0, 4096);
    bad_src.source = unregistered.data();
    expectRefused({bad_src}, StatusCode::kInvalidArgument);
    expectRefused({write(0, len - 100, 4096)}, StatusCode::kOutOfRange);
    TransferRequest bad_seg = write(0, 0, 4096);
    bad_seg.target_id = 12345;
    expectRefused({bad_seg}, StatusCode::kNotFound);
    expectRefused({write(0, 0, 0)}, StatusCode::kInvalidArgument);
    // One bad request spoils the whole batch: the good one is not sent either.
    expectRefused({write(0, 0, 4096), write(0, len - 1, 2)}, StatusCode::kOutOfRange);
    // Prove the connection works, then that nothing above reached the target.
    ASSERT_TRUE(run({read(0, 0, 16)}, Deadline::afterMs(10000)).ok());
    for (uint64_t i = 0; i < len; ++i)
        ASSERT_EQ(remote_->bytes()[i], 0xAB) << i;
}

TEST_F(TcpEngineTest, WrongSecretIsRejected) {
    const uint64_t len = 64 * 1024;
    startPair(len, len, "right-secret", "wrong-secret");
    std::memset(remote_->data(), 0xCD, len);
    fillPattern(localPtr(0), len, 3);
    Status st = run({write(0, 0, len)}, Deadline::afterMs(10000));
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
    EXPECT_FALSE(engine_->probePeerAlive(seg_, Deadline::afterMs(5000)).ok());
    for (uint64_t i = 0; i < len; ++i)
        ASSERT_EQ(remote_->bytes()[i], 0xCD) << i;
}

TEST_F(TcpEngineTest, ProbeSeesLiveAndKilledPeers) {
    startPair(4096, 4096);
    EXPECT_TRUE(engine_->probePeerAlive(seg_, Deadline::afterMs(5000)).ok());
    EXPECT_TRUE(engine_->probePeerAlive(seg_, Deadline::afterMs(5000)).ok());  // reused
    child_->killAndReap();
    killed_ = true;
    auto t0 = std::chrono::steady_clock::now();
    Status st = engine_->probePeerAlive(seg_, Deadline::afterMs(3000));
    EXPECT_FALSE(st.ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3500ms) << st.toString();
}

// A transport that cannot start fails init with its name, after the ones
// already started are shut down (the name was read from a destroyed
// transport before: a crash instead of the error).
TEST(TcpEngineStart, HostIpNotOnThisHostFailsInitNamingTcp) {
    EngineOptions o;
    o.store = std::make_shared<InProcessKVStore>();
    o.segment_name = "not-here";
    o.secret = "s";
    TransferEngine engine(o);
    const Status st = engine.init("192.0.2.1", {});  // TEST-NET-1: never a local address
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("starting transport tcp"), std::string::npos) << st.toString();
}

}  // namespace
}  // namespace mooncake::te
