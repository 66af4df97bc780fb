// Helpers shared by the shm transport tests: temp stores, engines, patterns
// and forked children that report through their exit code.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::te::shm_test {

inline constexpr const char* kSecret = "shm-test-secret";
inline constexpr int64_t kWaitMs = 30000;  // generous: only hit when something is broken

class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "shm_test.XXXXXX").string();
        path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
    }
    ~TempDir() {
        std::error_code ec;
        if (!path_.empty())
            std::filesystem::remove_all(path_, ec);
    }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

inline std::unique_ptr<TransferEngine> startEngine(std::shared_ptr<KVStore> store,
                                                   const std::string& name,
                                                   const std::string& secret = kSecret,
                                                   bool force_tcp = false) {
    EngineOptions o;
    o.store = std::move(store);
    o.segment_name = name;
    o.secret = secret;
    o.force_tcp = force_tcp;
    o.open_timeout_ms = kWaitMs;
    auto e = std::make_unique<TransferEngine>(o);
    Status st = e->init("127.0.0.1", {});
    if (!st.ok()) {
        std::fprintf(stderr, "engine %s: %s\n", name.c_str(), st.toString().c_str());
        return nullptr;
    }
    return e;
}

inline Status transfer(TransferEngine& e, TransferOpcode op, void* src, SegmentID id, uint64_t addr,
                       uint64_t len) {
    MC_ASSIGN_OR_RETURN(BatchID b, e.allocateBatchID(1));
    TransferRequest r{op, src, id, addr, len};
    Status st = e.submitTransfer(b, {r});
    if (st.ok())
        st = e.waitBatch(b, Deadline::afterMs(kWaitMs));
    (void)e.freeBatchID(b);
    return st;
}

// Deterministic bytes that differ per seed and per position.
inline void fillPattern(char* p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(p + i, &x, 8);
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, n - i);  // the last partial word
}

inline bool allBytes(const char* p, size_t n, char v) {
    for (size_t i = 0; i < n; ++i) {
        if (p[i] != v)
            return false;
    }
    return true;
}

// Page-aligned heap memory (plain, not shareable).
struct Buffer {
    explicit Buffer(size_t n)
        : size(n), data(static_cast<char*>(std::aligned_alloc(4096, round(n)))) {
        std::memset(data, 0, n);
    }
    ~Buffer() { std::free(data); }
    static size_t round(size_t n) { return (n + 4095) / 4096 * 4096; }
    size_t size;
    char* data;
};

// glibc 2.36 declares pidfd_open without C linkage; go through syscall().
inline int pidfdOpen(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// A forked child. Reaped (killed first if needed) on destruction.
class Child {
public:
    explicit Child(const std::function<int()>& body) {
        std::fflush(nullptr);
        pid_ = ::fork();
        if (pid_ == 0) {
            int rc = 98;
            try {
                rc = body();
            } catch (...) {
                rc = 99;
            }
            ::_exit(rc);
        }
        pidfd_ = pid_ > 0 ? pidfdOpen(pid_) : -1;
    }
    explicit Child(pid_t pid) : pid_(pid), pidfd_(pidfdOpen(pid)) {}
    ~Child() {
        if (pid_ > 0 && !reaped_) {
            ::kill(pid_, SIGKILL);
            (void)wait(Deadline::never());
        }
        if (pidfd_ >= 0)
            ::close(pidfd_);
    }
    bool ok() const { return pid_ > 0 && pidfd_ >= 0; }
    pid_t pid() const { return pid_; }
    void kill(int sig) const { ::kill(pid_, sig); }
    // SIGSTOP lands asynchronously; returns once the child really is stopped.
    bool stop() const {
        if (::kill(pid_, SIGSTOP) != 0)
            return false;
        siginfo_t info{};
        return ::waitid(P_PID, static_cast<id_t>(pid_), &info, WSTOPPED) == 0;
    }

    // Exit code; 128 + signal when killed; -1 when still running at the deadline.
    int wait(Deadline deadline) {
        pollfd p{pidfd_, POLLIN, 0};
        if (::poll(&p, 1, deadline.remainingMsForPoll()) <= 0)
            return -1;
        int status = 0;
        if (::waitpid(pid_, &status, 0) != pid_)
            return -1;
        reaped_ = true;
        if (WIFSIGNALED(status))
            return 128 + WTERMSIG(status);
        return WEXITSTATUS(status);
    }

private:
    pid_t pid_ = -1;
    int pidfd_ = -1;
    bool reaped_ = false;
};

// Checks inside a child, where gtest assertions would not reach the parent.
#define CHILD_CHECK(cond)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            std::fprintf(stderr, "child check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)
#define CHILD_OK(expr)                                                       \
    do {                                                                     \
        ::mooncake::Status _st = (expr);                                     \
        if (!_st.ok()) {                                                     \
            std::fprintf(stderr, "child at %s:%d: %s\n", __FILE__, __LINE__, \
                         _st.toString().c_str());                            \
            return 1;                                                        \
        }                                                                    \
    } while (0)

inline std::string waitKey(KVStore& store, const std::string& key) {
    auto v = store.get(key, Deadline::afterMs(kWaitMs));
    return v.ok() ? v.value() : std::string();
}

inline uint64_t waitAddr(KVStore& store, const std::string& key) {
    std::string v = waitKey(store, key);
    return v.empty() ? 0 : std::stoull(v);
}

}  // namespace mooncake::te::shm_test
