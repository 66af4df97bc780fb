#include "benchmarks/te_bench/child.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "benchmarks/te_bench/measure.h"

namespace mooncake::te::bench {
namespace {

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

}  // namespace

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

}  // namespace mooncake::te::bench
