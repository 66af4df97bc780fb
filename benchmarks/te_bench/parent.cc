#include "benchmarks/te_bench/parent.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"

namespace mooncake::te::bench {
namespace {

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

}  // namespace

void runParent(const Options& o, const std::string& dir, Control& ctl, uint16_t raw_port,
               std::vector<Sample>* samples, std::vector<std::string>* errors) {
    Parent parent(o, dir, ctl);
    parent.setup(raw_port);
    parent.run();
    *samples = parent.samples();
    *errors = parent.errors();
}  // closes the raw socket and shuts the initiators down

}  // namespace mooncake::te::bench
