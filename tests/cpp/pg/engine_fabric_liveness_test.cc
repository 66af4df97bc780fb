// EngineFabric across real processes on one host: a SIGKILLed peer writes
// nothing and fails none of our writes (its window stays mapped), so the
// fabric must notice the dead process itself, and a collective blocked on it
// must fail naming that rank rather than run to its deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/engine_fabric.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRanks = 3;
constexpr int kVictim = 2;

// Child exit codes, so the parent can say which check failed.
enum Exit : int {
    kOk = 0,
    kBootstrap = 10,
    kFirstCall = 11,
    kWrongCode = 12,
    kWrongBlame = 13,
    kNotFailed = 14,
};

int runRank(const std::string& dir, int rank, bool probe_local_pids, pid_t parent) {
    // Die with the test process, whatever it dies of: a child left in
    // pause() would hold ctest's output pipe open forever.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)
        return kBootstrap;
    auto store = std::make_shared<FileKVStore>(dir);
    CommOptions options;
    options.chunk_bytes = 64 << 10;
    EngineFabricOptions fo;
    fo.rank = rank;
    fo.size = kRanks;
    fo.window_bytes = Communicator::windowBytesFor(kRanks, options);
    fo.group_key = "liveness";
    fo.bootstrap_timeout_ms = 8000;
    fo.probe_local_pids = probe_local_pids;
    auto made = EngineFabric::create(store, fo);
    if (!made.ok())
        return kBootstrap;
    std::shared_ptr<EngineFabric> fabric = made.value();
    Communicator comm(fabric, options);
    std::vector<float> v(1 << 16, 1.0f);
    if (!comm.allReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum,
                        Deadline::after(std::chrono::seconds(8)))
             .ok()) {
        return kFirstCall;
    }
    if (rank == kVictim) {
        // Tell the parent it may kill us now, and wait for it.
        (void)store->set("victim_ready", "1");
        for (;;)
            ::pause();
    }
    // Blocks on the victim (and on the other survivor, which blocks on the
    // victim too) until the victim's death is noticed.
    Status st = comm.allReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum,
                               Deadline::after(std::chrono::seconds(20)));
    const std::vector<int> blamed = comm.lastFailure().failed_ranks;
    // A survivor that exits is a dead peer too: stay until both are done.
    (void)store->set("done" + std::to_string(rank), "1");
    (void)store->get("done" + std::to_string(1 - rank), Deadline::after(std::chrono::seconds(20)));
    if (st.code() != StatusCode::kPeerFailure)
        return kWrongCode;
    if (blamed != std::vector<int>{kVictim})
        return kWrongBlame;
    // A survivor may have failed the call on the other one's abort notice
    // before its own probe came back; its fabric must still find out.
    const Deadline noticed = Deadline::after(std::chrono::seconds(5));
    while (!fabric->peerFailed(kVictim)) {
        if (noticed.expired())
            return kNotFailed;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return kOk;
}

// Forks the ranks and, whichever assertion ends a test, kills and reaps every
// child still running in TearDown.
class EngineFabricLiveness : public ::testing::Test {
protected:
    void TearDown() override {
        for (pid_t pid : kids_) {
            if (pid > 0) {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
            }
        }
        if (!dir_.empty()) {
            const std::string cmd = "rm -rf '" + dir_ + "'";
            EXPECT_EQ(std::system(cmd.c_str()), 0);
        }
    }

    // Waits for child `r` and forgets it, so TearDown leaves it alone.
    int reap(int r) {
        int status = 0;
        EXPECT_EQ(::waitpid(kids_[r], &status, 0), kids_[r]) << "rank " << r;
        kids_[r] = -1;
        return status;
    }

    void killVictimAndCheckSurvivors(bool probe_local_pids) {
        char tmpl[] = "/tmp/mc_pg_liveness_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        const pid_t parent = ::getpid();
        // Fork before this process starts any thread of its own.
        for (int r = 0; r < kRanks; ++r) {
            const pid_t pid = ::fork();
            ASSERT_GE(pid, 0);
            if (pid == 0)
                ::_exit(runRank(dir_, r, probe_local_pids, parent));
            kids_.push_back(pid);
        }
        FileKVStore store(dir_);
        auto ready = store.get("victim_ready", Deadline::after(std::chrono::seconds(8)));
        ASSERT_TRUE(ready.ok()) << ready.status().toString();
        ASSERT_EQ(::kill(kids_[kVictim], SIGKILL), 0);
        const auto killed = Clock::now();
        // The victim is reaped only after the survivors finish: until then it
        // is a zombie, which the liveness probe must count as dead too. The
        // survivors' own checks (kPeerFailure, not their 20 s deadline's
        // timeout; the victim blamed) say that the death was noticed.
        for (int r = 0; r < kRanks; ++r) {
            if (r == kVictim)
                continue;
            const int status = reap(r);
            EXPECT_TRUE(WIFEXITED(status)) << "rank " << r;
            EXPECT_EQ(WEXITSTATUS(status), kOk) << "rank " << r;
        }
        // A measurement, not a check: how long noticing took.
        const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
        std::cout << "kill -> both survivors failed and exited: " << seconds << " s (pid checks "
                  << (probe_local_pids ? "on" : "off") << ")\n";
        EXPECT_TRUE(WIFSIGNALED(reap(kVictim)));
    }

private:
    std::vector<pid_t> kids_;
    std::string dir_;
};

TEST_F(EngineFabricLiveness, KilledSameHostPeerIsNoticedAndBlamed) {
    killVictimAndCheckSurvivors(/*probe_local_pids=*/true);
}

// Without pid checks the dead process is found the way a peer on another
// host is: a liveness probe through the engine meets a closed connection.
TEST_F(EngineFabricLiveness, KilledPeerIsFoundByEngineProbesWithoutPidChecks) {
    killVictimAndCheckSurvivors(/*probe_local_pids=*/false);
}

}  // namespace
}  // namespace mooncake::pg
