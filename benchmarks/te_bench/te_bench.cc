// te_bench: WRITE latency and throughput of the transfer engine between two
// processes on one host, over shm and over tcp (a force_tcp engine pair),
// next to what the machine allows for each:
//   memcpy   single-process memcpy of the same sizes (the shm limit)
//   raw_tcp  a plain blocking loopback TCP stream between the same two
//            processes, one message + 1-byte ack per iteration (the tcp limit)
// One request is outstanding at a time. gbps (Gbit/s) is size / median
// latency, which a busy shared machine disturbs far less than the mean;
// gbps_mean is size * iterations / total time. Ratios use gbps.
//
//   te_bench [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]
//            [--json-output FILE]            (N may end in K, M or G)
//
// The parent process initiates every transfer; a forked child owns the target
// memory and follows the parent's phases over a socketpair.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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

struct Options {
    uint64_t min_bytes = 64;
    uint64_t max_bytes = 256ull << 20;
    int iters = 1000;
    int warmup = 50;
    std::string json_output;
};

struct Sample {
    std::string transport;
    uint64_t size = 0;
    double p50_us = 0, p99_us = 0, gbps = 0, gbps_mean = 0;
};

// ---- options and sizes -------------------------------------------------------------

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

// Times warmup + iters calls of `op` (each returns how long its measured part took).
Result<Sample> measure(const std::string& transport, uint64_t size, const Options& o,
                       const std::function<Result<Clock::duration>()>& op) {
    const int warmup = warmupFor(o, size), iters = itersFor(o, size);
    std::vector<double> ns;
    ns.reserve(iters);
    for (int i = 0; i < warmup + iters; ++i) {
        MC_ASSIGN_OR_RETURN(Clock::duration d, op());
        if (i >= warmup)
            ns.push_back(std::chrono::duration<double, std::nano>(d).count());
    }
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
    s.p50_us = rank(0.5) / 1e3;
    s.p99_us = rank(0.99) / 1e3;
    s.gbps = bits / rank(0.5);  // bits per ns = Gbit/s
    s.gbps_mean = bits * static_cast<double>(ns.size()) / total;
    std::fprintf(stderr, "%-8s %10llu B  p50 %10.2f us  p99 %10.2f us  %8.2f Gbit/s  (%d iters)\n",
                 transport.c_str(), static_cast<unsigned long long>(size), s.p50_us, s.p99_us,
                 s.gbps, iters);
    return s;
}

// ---- the control channel between the two processes ----------------------------------

class Control {
public:
    explicit Control(int fd) : fd_(fd) {}
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

void setNoDelay(int fd) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
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

int childMain(Control& ctl, int listen_fd, const std::string& dir, const Options& o) {
    const std::vector<uint64_t> sizes = sizeList(o);
    while (true) {
        std::string cmd = ctl.recv();
        if (cmd.empty() || cmd == "exit")
            return 0;
        if (cmd == "raw") {
            pollfd p{listen_fd, POLLIN, 0};
            int fd = ::poll(&p, 1, static_cast<int>(kControlTimeoutMs)) > 0
                         ? ::accept(listen_fd, nullptr, nullptr)
                         : -1;
            if (fd < 0)
                return 1;
            setNoDelay(fd);
            Buffer buf(o.max_bytes);
            char ack = 1;
            // Mirrors the parent's loop exactly, so no per-size messages are needed.
            for (uint64_t size : sizes) {
                const int n = warmupFor(o, size) + itersFor(o, size);
                for (int i = 0; i < n; ++i) {
                    if (!recvAll(fd, buf.data, size) || !sendAll(fd, &ack, 1))
                        break;
                }
            }
            ::close(fd);
            continue;
        }
        // "engine shm" or "engine tcp"
        const bool tcp = cmd == "engine tcp";
        Status st;
        auto e = makeEngine(dir, std::string("bench-target-") + (tcp ? "tcp" : "shm"), tcp, &st);
        void* mem = nullptr;
        std::unique_ptr<Buffer> plain;
        if (e && !tcp) {
            auto r = e->allocateSharedMemory(o.max_bytes, "bench");
            st = r.ok() ? Status::OK() : r.status();
            mem = r.ok() ? r.value() : nullptr;
        } else if (e) {
            plain = std::make_unique<Buffer>(o.max_bytes);
            mem = plain->data;
            st = e->registerLocalMemory(mem, o.max_bytes);
        }
        if (mem)
            std::memset(mem, 0x5c, o.max_bytes);  // fault the pages in before timing
        if (!st.ok() || !mem) {
            ctl.send("error " + st.toString());
            continue;
        }
        ctl.send("ready " + std::to_string(reinterpret_cast<uint64_t>(mem)));
        (void)ctl.recv();  // "done"
        e->shutdown();
    }
}

// ---- parent: initiates every transfer -------------------------------------------------------

void runMemcpy(const Options& o, std::vector<Sample>* out) {
    Buffer src(o.max_bytes), dst(o.max_bytes);
    for (uint64_t size : sizeList(o)) {
        auto s = measure("memcpy", size, o, [&]() -> Result<Clock::duration> {
            auto t0 = Clock::now();
            std::memcpy(dst.data, src.data, size);
            // Keeps the copy from being optimized away.
            asm volatile("" : : "r"(dst.data) : "memory");
            return Clock::now() - t0;
        });
        if (s.ok())
            out->push_back(s.value());
    }
}

Status runRawTcp(Control& ctl, uint16_t port, const Options& o, std::vector<Sample>* out) {
    if (!ctl.send("raw"))
        return PeerFailure("child is gone");
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        if (fd >= 0)
            ::close(fd);
        return Unavailable(std::string("connect to the child: ") + std::strerror(errno));
    }
    setNoDelay(fd);
    Buffer buf(o.max_bytes);
    Status result;
    for (uint64_t size : sizeList(o)) {
        auto s = measure("raw_tcp", size, o, [&]() -> Result<Clock::duration> {
            char ack = 0;
            auto t0 = Clock::now();
            if (!sendAll(fd, buf.data, size) || !recvAll(fd, &ack, 1)) {
                return PeerFailure("raw tcp stream broke");
            }
            return Clock::now() - t0;
        });
        if (!s.ok()) {
            result = s.status();
            break;
        }
        out->push_back(s.value());
    }
    ::close(fd);
    return result;
}

Status runEngine(Control& ctl, const std::string& dir, const std::string& kind, const Options& o,
                 std::vector<Sample>* out) {
    const bool tcp = kind == "tcp";
    Status st;
    auto e = makeEngine(dir, "bench-initiator-" + kind, tcp, &st);
    if (!e)
        return st.withContext("initiator engine");
    Buffer src(o.max_bytes);
    MC_RETURN_IF_ERROR(e->registerLocalMemory(src.data, o.max_bytes));
    if (!ctl.send("engine " + kind))
        return PeerFailure("child is gone");
    std::string reply = ctl.recv();
    if (reply.rfind("ready ", 0) != 0)
        return PeerFailure("target: " + reply);
    const uint64_t target = std::stoull(reply.substr(6));
    struct Done {  // releases the child from this phase on every path
        Control& ctl;
        ~Done() { ctl.send("done"); }
    } done{ctl};
    MC_ASSIGN_OR_RETURN(SegmentID id, e->openSegment("bench-target-" + kind));
    MC_ASSIGN_OR_RETURN(std::string via, e->transportFor(id, target, o.max_bytes));
    if (via != kind)
        return Internal("the engine picked " + via + " instead of " + kind);
    for (uint64_t size : sizeList(o)) {
        auto s = measure(kind, size, o, [&]() -> Result<Clock::duration> {
            MC_ASSIGN_OR_RETURN(BatchID b, e->allocateBatchID(1));
            TransferRequest req{TransferOpcode::kWrite, src.data, id, target, size};
            auto t0 = Clock::now();
            Status r = e->submitTransfer(b, {req});
            if (r.ok())
                r = e->waitBatch(b, Deadline::afterMs(60000));
            auto t1 = Clock::now();
            (void)e->freeBatchID(b);
            if (!r.ok())
                return r;
            return t1 - t0;
        });
        if (!s.ok())
            return s.status().withContext(kind + " WRITE of " + std::to_string(size));
        out->push_back(s.value());
    }
    return Status::OK();
}

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
        ",\"warmup\":" + std::to_string(o.warmup) +
        ",\"gbps_unit\":\"Gbit/s\",\"gbps_basis\":\"p50 latency\"},\n\"results\":[";
    for (size_t i = 0; i < samples.size(); ++i) {
        const Sample& s = samples[i];
        j += std::string(i ? ",\n" : "\n") + "{\"transport\":\"" + s.transport +
             "\",\"size\":" + std::to_string(s.size) + ",\"lat_us_p50\":" + num(s.p50_us) +
             ",\"lat_us_p99\":" + num(s.p99_us) + ",\"gbps\":" + num(s.gbps) +
             ",\"gbps_mean\":" + num(s.gbps_mean) + "}";
    }
    j += "],\n\"ratios\":[";
    std::vector<uint64_t> sizes = sizeList(o);
    for (size_t i = 0; i < sizes.size(); ++i) {
        j += std::string(i ? ",\n" : "\n") + "{\"size\":" + std::to_string(sizes[i]) +
             ",\"shm_vs_memcpy\":" + ratio("shm", "memcpy", sizes[i]) +
             ",\"tcp_vs_raw_socket\":" + ratio("tcp", "raw_tcp", sizes[i]) + "}";
    }
    j += "],\n\"errors\":[";
    for (size_t i = 0; i < errors.size(); ++i) {
        j += std::string(i ? "," : "") + "\"" + jsonEscape(errors[i]) + "\"";
    }
    return j + "]}\n";
}

int benchMain(int argc, char** argv) {
    Options o;
    if (!parseArgs(argc, argv, &o)) {
        std::fprintf(stderr,
                     "usage: te_bench [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N] "
                     "[--json-output FILE]\n");
        return 2;
    }
    std::vector<Sample> samples;
    std::vector<std::string> errors;
    runMemcpy(o, &samples);  // before fork: nothing else runs yet

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
    std::fflush(nullptr);
    pid_t child = ::fork();
    if (child == 0) {
        ::close(ctl_fds[0]);
        Control ctl(ctl_fds[1]);
        ::_exit(childMain(ctl, listen_fd, dir, o));
    }
    ::close(ctl_fds[1]);
    ::close(listen_fd);
    Control ctl(ctl_fds[0]);
    Status st = runRawTcp(ctl, ntohs(addr.sin_port), o, &samples);
    if (!st.ok())
        errors.push_back("raw_tcp: " + st.toString());
    for (const char* kind : {"shm", "tcp"}) {
        st = runEngine(ctl, dir, kind, o, &samples);
        if (!st.ok())
            errors.push_back(std::string(kind) + ": " + st.toString());
    }
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
