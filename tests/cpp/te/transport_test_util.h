// Helpers shared by the transport tests (tcp and shm): a temporary store
// directory, a TransportHost without an engine, and forked child processes
// that are always reaped.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <utility>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te::test {

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "mc_te_test.XXXXXX").string();
        path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
    }
    ~TempDir() {
        std::error_code ec;
        if (!path_.empty())
            std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// A TransportHost without an engine, for driving a transport directly.
class FakeHost : public TransportHost {
public:
    FakeHost(std::string name, std::string secret)
        : name_(std::move(name)), secret_(std::move(secret)) {}
    MemoryRegistry& memory() override { return memory_; }
    const std::string& secret() const override { return secret_; }
    const std::string& hostIp() const override { return ip_; }
    const std::string& segmentName() const override { return name_; }

private:
    MemoryRegistry memory_;
    std::string name_;
    std::string secret_;
    std::string ip_ = "127.0.0.1";
};

// glibc 2.36 declares pidfd_open without C linkage; go through syscall().
inline int pidfdOpen(pid_t pid) {
    return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// A forked child. Reaped (killed first if needed) on destruction.
class Child {
public:
    // Runs `body` in the child and exits with what it returns (99 when it
    // throws).
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
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;

    bool ok() const { return pid_ > 0 && pidfd_ >= 0; }
    bool reaped() const { return reaped_; }
    pid_t pid() const { return pid_; }
    void kill(int sig) const {
        if (pid_ > 0)  // never kill(-1, ...): that signals every process we may
            ::kill(pid_, sig);
    }
    // SIGSTOP lands asynchronously; returns once the child really is stopped.
    bool stop() const {
        if (pid_ <= 0 || ::kill(pid_, SIGSTOP) != 0)
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

}  // namespace mooncake::te::test
