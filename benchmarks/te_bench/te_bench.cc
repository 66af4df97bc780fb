// te_bench: WRITE latency and throughput of the transfer engine between two
// processes on one host, each transport next to what the machine allows for
// the same work. Three pairs, engine side vs its limit:
//   shm vs memcpy            one request at a time; memcpy is single-process,
//                            the bound for a transfer that is one memcpy
//   tcp vs raw_tcp           one request at a time. tcp: submitTransfer +
//                            waitBatch of one WRITE, which completes when the
//                            target's COMPLETION frame is back. raw_tcp: a
//                            blocking loopback socket between the same two
//                            processes sends the message, the receiver reads
//                            all of it and answers a 1-byte ack. Both: N bytes
//                            out and a small reply back per iteration.
//   tcp_stream vs            --depth messages in flight: the next WRITE is
//     raw_tcp_stream         submitted (sent) as soon as the oldest completed
//                            (was acked). Timing starts once depth messages
//                            are in flight and stops at the block's last
//                            completion-wait (the rest drains untimed).
//                            Completions come in bursts, so the time of one
//                            iteration is the mean interval between
//                            completions over a block, and p50/p99 are taken
//                            over the blocks.
// gbps (Gbit/s) is size / median iteration time, which a busy shared machine
// disturbs far less than the mean; gbps_mean is size * iterations / total
// time. Ratios use gbps. Both halves of a pair are measured size by size in
// --rounds alternating blocks (ABBA order), so load that comes and goes hits
// both alike; each block starts with untimed warmup iterations.
//
//   te_bench [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]
//            [--rounds N] [--depth N] [--pairs shm,tcp,tcp_stream]
//            [--cpus P,C] [--congestion ALGO] [--json-output FILE]
//                                            (N may end in K, M or G)
//
// --cpus pins the parent (initiator) and the child (target) process, with
// all their threads, to one CPU each, so that the two ends of every pair run
// in the same placement instead of wherever the scheduler puts them.
// --congestion sets the TCP congestion control of the raw sockets and, via
// MC_TCP_CONGESTION, of the engine's (default: the system's).
//
// The parent process initiates every transfer; a forked child owns the target
// memory, and the receiving end of the raw socket, which mirrors the parent's
// schedule so that no per-message header is needed.
//
// The parts: options.h (flags, pairs, schedule), measure.h (buffers, blocks,
// samples), channel.h (control channel, raw socket, engines), child.h (the
// target process), parent.h (the initiating process), report.h (the JSON).
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "benchmarks/te_bench/channel.h"
#include "benchmarks/te_bench/child.h"
#include "benchmarks/te_bench/measure.h"
#include "benchmarks/te_bench/options.h"
#include "benchmarks/te_bench/parent.h"
#include "benchmarks/te_bench/report.h"

namespace mooncake::te::bench {
namespace {

// Threads started later inherit the mask.
bool pinTo(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof(set), &set) == 0)
        return true;
    std::perror("te_bench: sched_setaffinity");
    return false;
}

int benchMain(int argc, char** argv) {
    Options o;
    if (!parseArgs(argc, argv, &o)) {
        std::fprintf(stderr,
                     "usage: te_bench [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N] "
                     "[--rounds N] [--depth N] [--pairs shm,tcp,tcp_stream] [--cpus P,C] "
                     "[--congestion ALGO] [--json-output FILE]\n");
        return 2;
    }
    // Before any engine exists, in both processes.
    if (!o.congestion.empty())
        ::setenv("MC_TCP_CONGESTION", o.congestion.c_str(), 1);
    std::string tmpl = (std::filesystem::temp_directory_path() / "te_bench.XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
        return 1;
    const std::string dir = tmpl;
    int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(addr);
    int ctl_fds[2];
    if (listen_fd < 0 || ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0 ||
        ::listen(listen_fd, 1) != 0 ||
        ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0 ||
        ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl_fds) != 0) {
        std::perror("te_bench setup");
        return 1;
    }
    // Fork before any engine exists in this process: a child of a threaded
    // process may only exec.
    std::fflush(nullptr);
    pid_t child = ::fork();
    if (child == 0) {
        ::close(ctl_fds[0]);
        Control ctl(ctl_fds[1]);
        if (o.child_cpu >= 0 && !pinTo(o.child_cpu))
            ::_exit(1);
        ::_exit(childMain(ctl, listen_fd, dir, o));
    }
    if (o.parent_cpu >= 0 && !pinTo(o.parent_cpu)) {
        ::kill(child, SIGKILL);
        return 1;
    }
    ::close(ctl_fds[1]);
    ::close(listen_fd);
    Control ctl(ctl_fds[0]);
    std::vector<Sample> samples;
    std::vector<std::string> errors;
    // Closes the raw socket and shuts the initiators down before it returns.
    runParent(o, dir, ctl, ntohs(addr.sin_port), &samples, &errors);
    ctl.send("exit");
    int status = 0;
    ::waitpid(child, &status, 0);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);

    std::string json = report(o, samples, errors);
    if (o.json_output.empty()) {
        std::fputs(json.c_str(), stdout);
    } else if (FILE* f = std::fopen(o.json_output.c_str(), "w")) {
        std::fputs(json.c_str(), f);
        std::fclose(f);
    } else {
        std::perror(o.json_output.c_str());
        return 1;
    }
    return errors.empty() ? 0 : 3;
}

}  // namespace
}  // namespace mooncake::te::bench

int main(int argc, char** argv) {
    return mooncake::te::bench::benchMain(argc, argv);
}
