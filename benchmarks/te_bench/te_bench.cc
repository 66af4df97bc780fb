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
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::te {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kControlTimeoutMs = 600000;   // one phase at the largest sizes stays well below
constexpr uint64_t kBytesPerSize = 2ull << 30;  // caps iterations of large sizes
constexpr int kMinIters = 5;
constexpr const char* kSecret = "te_bench";

struct PairSpec {
    const char* name;      // --pairs name
    const char* baseline;  // transport names in the results
    const char* engine;
    const char* ratio;  // key in the ratios table
    bool stream;
    bool raw;  // the baseline is the raw socket (the child must mirror it)
    const char* method;
};

constexpr PairSpec kPairs[] = {
    {"shm", "memcpy", "shm", "shm_vs_memcpy", false, false,
     "one WRITE at a time (submitTransfer + waitBatch) into the peer's shared allocation vs one "
     "single-process memcpy of the same size"},
    {"tcp", "raw_tcp", "tcp", "tcp_vs_raw_socket", false, true,
     "one WRITE at a time: submitTransfer + waitBatch (returns once the target's COMPLETION "
     "is back) vs a blocking loopback socket between the same two processes that sends the "
     "message and waits for a 1-byte ack the receiver sends after reading all of it"},
    {"tcp_stream", "raw_tcp_stream", "tcp_stream", "tcp_stream_vs_raw_stream", true, true,
     "depth WRITEs in flight, each in its own batch, the next submitted when the oldest "
     "completed vs depth messages in flight on the raw socket, the next sent when the oldest "
     "was acked; timed from a full pipeline, the last in-flight messages drain untimed; "
     "iteration time = mean interval between completions over one block, p50/p99 over the "
     "blocks"},
};
constexpr int kNumPairs = static_cast<int>(std::size(kPairs));

struct Options {
    uint64_t min_bytes = 64;
    uint64_t max_bytes = 256ull << 20;
    int iters = 1000;
    int warmup = 50;
    int rounds = 6;
    int depth = 4;
    bool pairs[kNumPairs] = {true, true, true};
    int parent_cpu = -1, child_cpu = -1;
    std::string congestion;  // empty: the system's
    std::string json_output;

    bool any(bool raw) const {
        for (int p = 0; p < kNumPairs; ++p) {
            if (pairs[p] && kPairs[p].raw == raw)
                return true;
        }
        return false;
    }
    bool enabled(const char* name) const {
        for (int p = 0; p < kNumPairs; ++p) {
            if (pairs[p] && std::strcmp(kPairs[p].name, name) == 0)
                return true;
        }
        return false;
    }
};

struct Sample {
    std::string transport;
    uint64_t size = 0;
    int iters = 0;
    double p50_us = 0, p99_us = 0, gbps = 0, gbps_mean = 0;
};

// ---- options, sizes and the schedule ------------------------------------------------

// A decimal count with an optional K/M/G (binary) suffix.
bool parseBytes(const std::string& text, uint64_t* out) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || end == text.c_str() || text[0] == '-')
        return false;
    int shift = 0;
    switch (*end) {
        case 'K':
        case 'k':
            shift = 10;
            break;
        case 'M':
        case 'm':
            shift = 20;
            break;
        case 'G':
        case 'g':
            shift = 30;
            break;
        default:
            break;
    }
    if (shift != 0)
        ++end;
    if (*end != '\0' || v > (UINT64_MAX >> shift))
        return false;
    *out = static_cast<uint64_t>(v) << shift;
    return true;
}

bool parsePairs(const std::string& list, bool* pairs) {
    std::fill(pairs, pairs + kNumPairs, false);
    size_t start = 0;
    while (start <= list.size()) {
        size_t comma = std::min(list.find(',', start), list.size());
        std::string name = list.substr(start, comma - start);
        bool found = false;
        for (int p = 0; p < kNumPairs; ++p) {
            if (name == kPairs[p].name)
                pairs[p] = found = true;
        }
        if (!found)
            return false;
        start = comma + 1;
    }
    return true;
}

bool parseArgs(int argc, char** argv, Options* o) {
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i], value;
        size_t eq = flag.find('=');
        if (eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
        } else if (i + 1 < argc) {
            value = argv[++i];
        }
        uint64_t n = 0;
        bool ok = !value.empty();
        if (flag == "--min-bytes") {
            ok = ok && parseBytes(value, &o->min_bytes) && o->min_bytes > 0;
        } else if (flag == "--max-bytes") {
            ok = ok && parseBytes(value, &o->max_bytes);
        } else if (flag == "--iters" || flag == "--warmup") {
            ok = ok && parseBytes(value, &n) && n <= INT32_MAX;
            (flag == "--iters" ? o->iters : o->warmup) = static_cast<int>(n);
        } else if (flag == "--rounds" || flag == "--depth") {
            ok = ok && parseBytes(value, &n) && n > 0 && n <= 1024;
            (flag == "--rounds" ? o->rounds : o->depth) = static_cast<int>(n);
        } else if (flag == "--cpus") {
            char* end = nullptr;
            o->parent_cpu = static_cast<int>(std::strtol(value.c_str(), &end, 10));
            ok = ok && *end == ',' && o->parent_cpu >= 0;
            if (ok) {
                o->child_cpu = static_cast<int>(std::strtol(end + 1, &end, 10));
                ok = *end == '\0' && o->child_cpu >= 0 && o->parent_cpu < CPU_SETSIZE &&
                     o->child_cpu < CPU_SETSIZE;
            }
        } else if (flag == "--pairs") {
            ok = ok && parsePairs(value, o->pairs);
        } else if (flag == "--congestion") {
            o->congestion = value;
        } else if (flag == "--json-output") {
            o->json_output = value;
        } else {
            ok = false;
        }
        if (!ok) {
            std::fprintf(stderr, "te_bench: bad argument %s '%s'\n", flag.c_str(), value.c_str());
            return false;
        }
    }
    return o->min_bytes <= o->max_bytes && o->iters > 0;
}

// Powers of 4 from min_bytes, plus max_bytes itself.
std::vector<uint64_t> sizeList(const Options& o) {
    std::vector<uint64_t> sizes;
    for (uint64_t s = o.min_bytes; s <= o.max_bytes; s = s > UINT64_MAX / 4 ? UINT64_MAX : s * 4) {
        sizes.push_back(s);
    }
    if (sizes.back() != o.max_bytes)
        sizes.push_back(o.max_bytes);
    return sizes;
}

// Large sizes run fewer iterations so every size moves about kBytesPerSize.
int itersFor(const Options& o, uint64_t size) {
    uint64_t n = std::max<uint64_t>(kMinIters, kBytesPerSize / size);
    return static_cast<int>(std::min<uint64_t>(n, static_cast<uint64_t>(o.iters)));
}
int warmupFor(const Options& o, uint64_t size) {
    uint64_t n = std::max<uint64_t>(1, kBytesPerSize / 8 / size);
    return static_cast<int>(std::min<uint64_t>(n, static_cast<uint64_t>(o.warmup)));
}

// One block: `warmup` untimed then `iters` timed iterations of one side of a pair.
struct Block {
    uint64_t size = 0;
    int pair = 0;
    bool engine = false;
    int warmup = 0;
    int iters = 0;
};

// Sizes in order; per size every enabled pair in `rounds` rounds, the two
// sides in ABBA order. Parent and child derive the same list.
std::vector<Block> schedule(const Options& o) {
    std::vector<Block> blocks;
    for (uint64_t size : sizeList(o)) {
        const int iters = itersFor(o, size);
        const int rounds = std::min(o.rounds, iters);
        const int warmup = std::max(1, (warmupFor(o, size) + rounds - 1) / rounds);
        for (int p = 0; p < kNumPairs; ++p) {
            if (!o.pairs[p])
                continue;
            for (int r = 0; r < rounds; ++r) {
                const int n = iters / rounds + (r < iters % rounds ? 1 : 0);
                const bool engine_first = r % 2 == 1;
                // A stream block is timed only once depth messages are in
                // flight; before that an iteration waits for nothing.
                const int w = kPairs[p].stream ? std::max(warmup, o.depth) : warmup;
                blocks.push_back({size, p, engine_first, w, n});
                blocks.push_back({size, p, !engine_first, w, n});
            }
        }
    }
    return blocks;
}

// Page-aligned, pre-faulted memory, so no phase pays first-touch costs.
struct Buffer {
    explicit Buffer(uint64_t n)
        : data(static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
        if (data)
            std::memset(data, 0x5c, n);
    }
    ~Buffer() { std::free(data); }
    char* data;
};

// One iteration; returns how long its measured part took. `last` is set on
// the final iteration of a block, which then drains what is still in flight,
// outside the measured part.
using Op = std::function<Result<Clock::duration>(bool last)>;

// Appends the time of every timed iteration to `ns`; with `per_block`, one
// value instead: the mean over the block. Streams need that: completions
// arrive in bursts, so single intervals say little about the rate.
Status runBlock(const Block& b, const Op& op, bool per_block, std::vector<double>* ns) {
    const int total = b.warmup + b.iters;
    double sum = 0;
    for (int i = 0; i < total; ++i) {
        MC_ASSIGN_OR_RETURN(Clock::duration d, op(i == total - 1));
        if (i < b.warmup)
            continue;
        const double v = std::chrono::duration<double, std::nano>(d).count();
        if (per_block)
            sum += v;
        else
            ns->push_back(v);
    }
    if (per_block && b.iters > 0)
        ns->push_back(sum / b.iters);
    return Status::OK();
}

Sample summarize(const std::string& transport, uint64_t size, int iters, std::vector<double> ns) {
    double total = 0;
    for (double v : ns)
        total += v;
    std::sort(ns.begin(), ns.end());
    auto rank = [&](double q) {
        size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(ns.size())));
        return ns[std::clamp<size_t>(k, 1, ns.size()) - 1];
    };
    const double bits = 8.0 * static_cast<double>(size);
    Sample s;
    s.transport = transport;
    s.size = size;
    s.iters = iters;
    s.p50_us = rank(0.5) / 1e3;
    s.p99_us = rank(0.99) / 1e3;
    s.gbps = bits / rank(0.5);                                    // bits per ns = Gbit/s
    s.gbps_mean = bits * static_cast<double>(ns.size()) / total;  // per-block means weigh alike
    std::fprintf(stderr, "%-15s %10llu B  p50 %10.2f us  p99 %10.2f us  %8.2f Gbit/s  (%d iters)\n",
                 transport.c_str(), static_cast<unsigned long long>(size), s.p50_us, s.p99_us,
                 s.gbps, s.iters);
    return s;
}

// ---- the control channel between the two processes ----------------------------------

class Control {
public:
    explicit Control(int fd) : fd_(fd) {}
    int fd() const { return fd_; }
    bool send(const std::string& line) {
        std::string msg = line + "\n";
        size_t off = 0;
        while (off < msg.size()) {
            ssize_t n = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
            if (n <= 0 && errno != EINTR)
                return false;
            if (n > 0)
                off += static_cast<size_t>(n);
        }
        return true;
    }
    // The next line, or "" on EOF/timeout.
    std::string recv() {
        Deadline deadline = Deadline::afterMs(kControlTimeoutMs);
        while (true) {
            size_t nl = buf_.find('\n');
            if (nl != std::string::npos) {
                std::string line = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return line;
            }
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, deadline.remainingMsForPoll()) <= 0)
                return "";
            char tmp[512];
            ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
            if (n <= 0)
                return "";
            buf_.append(tmp, static_cast<size_t>(n));
        }
    }

private:
    int fd_;
    std::string buf_;
};

bool sendAll(int fd, const char* p, uint64_t n) {
    while (n > 0) {
        ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return false;
        }
        p += k;
        n -= static_cast<uint64_t>(k);
    }
    return true;
}

bool recvAll(int fd, char* p, uint64_t n) {
    while (n > 0) {
        ssize_t k = ::recv(fd, p, n, 0);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return false;
        }
        p += k;
        n -= static_cast<uint64_t>(k);
    }
    return true;
}

// As the engine sets its sockets, so the comparison is like for like.
bool setRawOptions(int fd, const std::string& congestion) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!congestion.empty() && ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion.data(),
                                            static_cast<socklen_t>(congestion.size())) != 0) {
        std::perror(("te_bench: TCP_CONGESTION " + congestion).c_str());
        return false;
    }
    return true;
}

// The congestion control new sockets get.
std::string systemCongestion() {
    std::string name;
    if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r")) {
        char buf[64] = {};
        if (std::fgets(buf, sizeof(buf), f))
            name = buf;
        std::fclose(f);
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
        name.pop_back();
    return name;
}

std::unique_ptr<TransferEngine> makeEngine(const std::string& dir, const std::string& name,
                                           bool force_tcp, Status* st) {
    EngineOptions o;
    o.store = std::make_shared<FileKVStore>(dir);
    o.segment_name = name;
    o.secret = kSecret;
    o.force_tcp = force_tcp;
    auto e = std::make_unique<TransferEngine>(o);
    *st = e->init("127.0.0.1", {});
    return st->ok() ? std::move(e) : nullptr;
}

// ---- child: owns the target memory ------------------------------------------------------

struct Target {
    std::unique_ptr<TransferEngine> engine;
    std::unique_ptr<Buffer> plain;
    void* mem = nullptr;
};

// "target <kind> <addr>" or "error <kind> <reason>" for the parent.
std::string openTarget(const std::string& dir, const std::string& kind, const Options& o,
                       Target* t) {
    const bool tcp = kind == "tcp";
    Status st;
    t->engine = makeEngine(dir, "bench-target-" + kind, tcp, &st);
    if (t->engine && !tcp) {
        auto r = t->engine->allocateSharedMemory(o.max_bytes, "bench");
        st = r.ok() ? Status::OK() : r.status();
        t->mem = r.ok() ? r.value() : nullptr;
    } else if (t->engine) {
        t->plain = std::make_unique<Buffer>(o.max_bytes);
        t->mem = t->plain->data;
        st = t->plain->data ? t->engine->registerLocalMemory(t->mem, o.max_bytes)
                            : Internal("out of memory");
    }
    if (!st.ok() || !t->mem)
        return "error " + kind + " " + st.toString();
    std::memset(t->mem, 0x5c, o.max_bytes);  // fault the pages in before timing
    return "target " + kind + " " + std::to_string(reinterpret_cast<uint64_t>(t->mem));
}

// The receiving end of raw_tcp and raw_tcp_stream: every message is read
// whole and acked with one byte, in the order of the parent's schedule.
void serveRaw(Control& ctl, int listen_fd, const Options& o) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {ctl.fd(), POLLIN, 0}};
    // The control socket turning readable means the parent gave up before connecting.
    if (::poll(p, 2, static_cast<int>(kControlTimeoutMs)) <= 0 || !(p[0].revents & POLLIN))
        return;
    int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0 || !setRawOptions(fd, o.congestion)) {
        if (fd >= 0)
            ::close(fd);
        return;
    }
    Buffer buf(o.max_bytes);
    const char ack = 1;
    bool ok = buf.data != nullptr;
    for (const Block& b : schedule(o)) {
        if (!ok || !kPairs[b.pair].raw || b.engine)
            continue;
        for (int i = 0; ok && i < b.warmup + b.iters; ++i)
            ok = recvAll(fd, buf.data, b.size) && sendAll(fd, &ack, 1);
    }
    ::close(fd);
}

int childMain(Control& ctl, int listen_fd, const std::string& dir, const Options& o) {
    Target shm, tcp;
    if (o.enabled("shm"))
        ctl.send(openTarget(dir, "shm", o, &shm));
    if (o.enabled("tcp") || o.enabled("tcp_stream"))
        ctl.send(openTarget(dir, "tcp", o, &tcp));
    ctl.send("ready");
    if (o.any(true))
        serveRaw(ctl, listen_fd, o);
    while (true) {
        std::string cmd = ctl.recv();
        if (cmd.empty() || cmd == "exit")
            break;
    }
    for (Target* t : {&shm, &tcp}) {
        if (t->engine)
            t->engine->shutdown();
    }
    return 0;
}

// ---- parent: initiates every transfer -------------------------------------------------------

int connectRaw(uint16_t port, const std::string& congestion) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && (!setRawOptions(fd, congestion) ||
                    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// The initiator's side of one engine transport.
struct Initiator {
    std::unique_ptr<TransferEngine> engine;
    SegmentID target_id = 0;
    uint64_t target = 0;
};

Status openInitiator(const std::string& dir, const std::string& kind, const std::string& reply,
                     Buffer& src, uint64_t len, Initiator* in) {
    if (reply.rfind("target " + kind + " ", 0) != 0)
        return PeerFailure("target: " + reply);
    in->target = std::stoull(reply.substr(8 + kind.size()));
    Status st;
    in->engine = makeEngine(dir, "bench-initiator-" + kind, kind == "tcp", &st);
    if (!in->engine)
        return st.withContext("initiator engine");
    MC_RETURN_IF_ERROR(in->engine->registerLocalMemory(src.data, len));
    MC_ASSIGN_OR_RETURN(in->target_id, in->engine->openSegment("bench-target-" + kind));
    MC_ASSIGN_OR_RETURN(std::string via, in->engine->transportFor(in->target_id, in->target, len));
    if (via != kind)
        return Internal("the engine picked " + via + " instead of " + kind);
    return Status::OK();
}

class Parent {
public:
    Parent(const Options& o, const std::string& dir, Control& ctl)
        : o_(o), dir_(dir), ctl_(ctl), src_(o.max_bytes), dst_(o.max_bytes) {}
    ~Parent() {
        if (raw_fd_ >= 0)
            ::close(raw_fd_);
    }

    // Everything before the first block; failures disable the pairs they affect.
    void setup(uint16_t raw_port) {
        if (o_.any(true)) {
            raw_fd_ = connectRaw(raw_port, o_.congestion);
            if (raw_fd_ < 0)
                errors_.push_back(std::string("raw_tcp: connect to the child: ") +
                                  std::strerror(errno));
        }
        while (true) {
            std::string line = ctl_.recv();
            if (line.empty() || line == "ready")
                break;
            const bool shm = line.find(" shm") == line.find(' ');
            Initiator& in = shm ? shm_ : tcp_;
            Status st = openInitiator(dir_, shm ? "shm" : "tcp", line, src_, o_.max_bytes, &in);
            if (!st.ok()) {
                in.engine.reset();
                errors_.push_back(std::string(shm ? "shm" : "tcp") + ": " + st.toString());
            }
        }
    }

    void run() {
        std::vector<double> ns[2];
        int iters[2] = {0, 0};
        const std::vector<Block> blocks = schedule(o_);
        for (size_t i = 0; i < blocks.size(); ++i) {
            const Block& b = blocks[i];
            const PairSpec& pair = kPairs[b.pair];
            Status st = runOne(b, &ns[b.engine ? 1 : 0]);
            iters[b.engine ? 1 : 0] += b.iters;
            if (!st.ok()) {
                fail(b.pair, b.engine,
                     std::string(b.engine ? pair.engine : pair.baseline) + " WRITE of " +
                         std::to_string(b.size) + ": " + st.toString());
                ns[b.engine ? 1 : 0].clear();
            }
            const bool pair_done = i + 1 == blocks.size() || blocks[i + 1].pair != b.pair ||
                                   blocks[i + 1].size != b.size;
            if (!pair_done)
                continue;
            if (!ns[0].empty())
                samples_.push_back(summarize(pair.baseline, b.size, iters[0], std::move(ns[0])));
            if (!ns[1].empty())
                samples_.push_back(summarize(pair.engine, b.size, iters[1], std::move(ns[1])));
            ns[0].clear();
            ns[1].clear();
            iters[0] = iters[1] = 0;
        }
    }

    const std::vector<Sample>& samples() const { return samples_; }
    const std::vector<std::string>& errors() const { return errors_; }

private:
    // Records the error and drops that side of the pair for the sizes still to come.
    void fail(int pair, bool engine, const std::string& what) {
        errors_.push_back(what);
        failed_[pair][engine ? 1 : 0] = true;
        if (!engine && kPairs[pair].raw && raw_fd_ >= 0) {
            // The stream is out of step now; the child reads EOF and stops mirroring.
            ::close(raw_fd_);
            raw_fd_ = -1;
        }
    }

    Initiator* initiatorFor(const PairSpec& pair) {
        Initiator* in = std::strcmp(pair.engine, "shm") == 0 ? &shm_ : &tcp_;
        return in->engine ? in : nullptr;
    }

    Status runOne(const Block& b, std::vector<double>* ns) {
        const PairSpec& pair = kPairs[b.pair];
        if (failed_[b.pair][b.engine ? 1 : 0])
            return Status::OK();
        if (b.engine) {
            Initiator* in = initiatorFor(pair);
            if (!in)
                return Status::OK();  // its setup already failed and was reported
            if (pair.stream)
                return runBlock(b, engineStreamOp(*in, b.size), true, ns);
            return runBlock(b, enginePingPongOp(*in, b.size), false, ns);
        }
        if (!pair.raw)
            return runBlock(b, memcpyOp(b.size), false, ns);
        if (raw_fd_ < 0)
            return Status::OK();
        if (pair.stream)
            return runBlock(b, rawStreamOp(b.size), true, ns);
        return runBlock(b, rawPingPongOp(b.size), false, ns);
    }

    Op memcpyOp(uint64_t size) {
        return [this, size](bool) -> Result<Clock::duration> {
            auto t0 = Clock::now();
            std::memcpy(dst_.data, src_.data, size);
            // Keeps the copy from being optimized away.
            asm volatile("" : : "r"(dst_.data) : "memory");
            return Clock::now() - t0;
        };
    }

    Op rawPingPongOp(uint64_t size) {
        return [this, size](bool) -> Result<Clock::duration> {
            char ack = 0;
            auto t0 = Clock::now();
            if (!sendAll(raw_fd_, src_.data, size) || !recvAll(raw_fd_, &ack, 1))
                return PeerFailure("raw tcp stream broke");
            return Clock::now() - t0;
        };
    }

    Op rawStreamOp(uint64_t size) {
        auto outstanding = std::make_shared<int>(0);
        return [this, size, outstanding](bool last) -> Result<Clock::duration> {
            char acks[1024];
            auto t0 = Clock::now();
            if (!sendAll(raw_fd_, src_.data, size))
                return PeerFailure("raw tcp stream broke");
            ++*outstanding;
            const int keep = o_.depth - 1;
            if (*outstanding > keep) {
                if (!recvAll(raw_fd_, acks, 1))
                    return PeerFailure("raw tcp stream broke");
                --*outstanding;
            }
            auto t1 = Clock::now();
            // The rest of the pipeline drains untimed: those messages were
            // sent inside the block but complete after its last iteration.
            if (last && *outstanding > 0) {
                if (!recvAll(raw_fd_, acks, static_cast<uint64_t>(*outstanding)))
                    return PeerFailure("raw tcp stream broke");
                *outstanding = 0;
            }
            return t1 - t0;
        };
    }

    Op enginePingPongOp(Initiator& in, uint64_t size) {
        return [this, &in, size](bool) -> Result<Clock::duration> {
            TransferEngine& e = *in.engine;
            MC_ASSIGN_OR_RETURN(BatchID b, e.allocateBatchID(1));
            TransferRequest req{TransferOpcode::kWrite, src_.data, in.target_id, in.target, size};
            auto t0 = Clock::now();
            Status r = e.submitTransfer(b, {req});
            if (r.ok())
                r = e.waitBatch(b, Deadline::afterMs(60000));
            auto t1 = Clock::now();
            (void)e.freeBatchID(b);
            if (!r.ok())
                return r;
            return t1 - t0;
        };
    }

    // Batches are allocated and freed inside the timed part here: with
    // several in flight that cost is part of the steady state.
    Op engineStreamOp(Initiator& in, uint64_t size) {
        struct InFlight {
            TransferEngine* e;
            std::deque<BatchID> batches;
            Status retire(size_t keep) {
                Status first;
                while (batches.size() > keep) {
                    Status st = e->waitBatch(batches.front(), Deadline::afterMs(60000));
                    (void)e->freeBatchID(batches.front());
                    batches.pop_front();
                    if (first.ok())
                        first = st;
                }
                return first;
            }
            ~InFlight() { (void)retire(0); }
        };
        auto flight = std::make_shared<InFlight>();
        flight->e = in.engine.get();
        return [this, &in, size, flight](bool last) -> Result<Clock::duration> {
            auto t0 = Clock::now();
            MC_ASSIGN_OR_RETURN(BatchID b, flight->e->allocateBatchID(1));
            TransferRequest req{TransferOpcode::kWrite, src_.data, in.target_id, in.target, size};
            Status st = flight->e->submitTransfer(b, {req});
            if (!st.ok()) {
                (void)flight->e->freeBatchID(b);
                return st;
            }
            flight->batches.push_back(b);
            MC_RETURN_IF_ERROR(flight->retire(static_cast<size_t>(o_.depth - 1)));
            auto t1 = Clock::now();
            if (last)  // untimed, as for the raw stream
                MC_RETURN_IF_ERROR(flight->retire(0));
            return t1 - t0;
        };
    }

    const Options& o_;
    const std::string dir_;
    Control& ctl_;
    Buffer src_, dst_;
    int raw_fd_ = -1;
    Initiator shm_, tcp_;
    bool failed_[kNumPairs][2] = {};
    std::vector<Sample> samples_;
    std::vector<std::string> errors_;
};

// ---- report ------------------------------------------------------------------------------

std::string jsonEscape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\')
            out += '\\', out += c;
        else if (static_cast<unsigned char>(c) < 0x20)
            out += ' ';
        else
            out += c;
    }
    return out;
}

std::string num(double v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.4g", v);
    return b;
}

std::string report(const Options& o, const std::vector<Sample>& samples,
                   const std::vector<std::string>& errors) {
    std::map<std::pair<std::string, uint64_t>, double> gbps;
    for (const auto& s : samples)
        gbps[{s.transport, s.size}] = s.gbps;
    auto ratio = [&](const char* a, const char* b, uint64_t size) -> std::string {
        auto x = gbps.find({a, size}), y = gbps.find({b, size});
        if (x == gbps.end() || y == gbps.end() || y->second <= 0)
            return "null";
        return num(x->second / y->second);
    };
    std::string j =
        "{\"benchmark\":\"te_bench\",\"config\":{\"min_bytes\":" + std::to_string(o.min_bytes) +
        ",\"max_bytes\":" + std::to_string(o.max_bytes) + ",\"iters\":" + std::to_string(o.iters) +
        ",\"warmup\":" + std::to_string(o.warmup) + ",\"rounds\":" + std::to_string(o.rounds) +
        ",\"parent_cpu\":" + std::to_string(o.parent_cpu) +
        ",\"child_cpu\":" + std::to_string(o.child_cpu) + ",\"congestion\":\"" +
        jsonEscape(o.congestion.empty() ? systemCongestion() : o.congestion) + "\"" +
        ",\"depth\":" + std::to_string(o.depth) +
        ",\"gbps_unit\":\"Gbit/s\",\"gbps_basis\":\"p50 iteration time\"," +
        "\"order\":\"per size, each pair in alternating blocks (ABBA)\"},\n" + "\"method\":{";
    bool first = true;
    for (int p = 0; p < kNumPairs; ++p) {
        if (!o.pairs[p])
            continue;
        j += std::string(first ? "\n" : ",\n") + "\"" + kPairs[p].ratio + "\":\"" +
             jsonEscape(kPairs[p].method) + "\"";
        first = false;
    }
    j += "},\n\"results\":[";
    for (size_t i = 0; i < samples.size(); ++i) {
        const Sample& s = samples[i];
        j += std::string(i ? ",\n" : "\n") + "{\"transport\":\"" + s.transport +
             "\",\"size\":" + std::to_string(s.size) + ",\"iters\":" + std::to_string(s.iters) +
             ",\"lat_us_p50\":" + num(s.p50_us) + ",\"lat_us_p99\":" + num(s.p99_us) +
             ",\"gbps\":" + num(s.gbps) + ",\"gbps_mean\":" + num(s.gbps_mean) + "}";
    }
    j += "],\n\"ratios\":[";
    std::vector<uint64_t> sizes = sizeList(o);
    for (size_t i = 0; i < sizes.size(); ++i) {
        j += std::string(i ? ",\n" : "\n") + "{\"size\":" + std::to_string(sizes[i]);
        for (int p = 0; p < kNumPairs; ++p) {
            if (o.pairs[p]) {
                j += std::string(",\"") + kPairs[p].ratio +
                     "\":" + ratio(kPairs[p].engine, kPairs[p].baseline, sizes[i]);
            }
        }
        j += "}";
    }
    j += "],\n\"errors\":[";
    for (size_t i = 0; i < errors.size(); ++i) {
        j += std::string(i ? "," : "") + "\"" + jsonEscape(errors[i]) + "\"";
    }
    return j + "]}\n";
}

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
    {
        Parent parent(o, dir, ctl);
        parent.setup(ntohs(addr.sin_port));
        parent.run();
        samples = parent.samples();
        errors = parent.errors();
    }  // closes the raw socket and shuts the initiators down
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
}  // namespace mooncake::te

int main(int argc, char** argv) {
    return mooncake::te::benchMain(argc, argv);
}
