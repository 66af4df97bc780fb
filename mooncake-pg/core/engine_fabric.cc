#include "mooncake-pg/core/engine_fabric.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/random.h"

namespace mooncake::pg {

namespace {
constexpr size_t kSecretBytes = 16;

int64_t steadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// What /proc/<pid>/stat says about a process: whether it can still run (not
// a zombie) and its start time in clock ticks since boot. False when the
// process does not exist.
bool readProcStat(int32_t pid, bool* runnable, uint64_t* start) {
    const std::string path = "/proc/" + std::to_string(pid) + "/stat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    // The command name in parentheses may hold spaces and parentheses; the
    // fields after the last ')' are plain: state is field 3, starttime 22.
    const char* p = std::strrchr(buf, ')');
    if (p == nullptr) return false;
    ++p;
    char state = '?';
    int field = 2;
    uint64_t start_ticks = 0;
    while (*p != '\0' && field < 22) {
        while (*p == ' ') ++p;
        ++field;
        if (field == 3) state = *p;
        if (field == 22) start_ticks = std::strtoull(p, nullptr, 10);
        while (*p != '\0' && *p != ' ') ++p;
    }
    if (field < 22) return false;
    *runnable = state != 'Z' && state != 'X' && state != 'x';
    *start = start_ticks;
    return true;
}

// Locks an outbox by the deadline; false when another put still holds it.
bool lockBy(std::unique_lock<std::timed_mutex>& lock, Deadline deadline) {
    if (deadline.at() == Deadline::Clock::time_point::max()) {
        lock.lock();
        return true;
    }
    return lock.try_lock_until(deadline.at());
}
}  // namespace

EngineFabric::EngineFabric(std::shared_ptr<KVStore> store, EngineFabricOptions options)
    : store_(std::move(store)),
      options_(std::move(options)),
      peers_(new std::atomic<const Peer*>[static_cast<size_t>(options_.size)]),
      failed_(new std::atomic<bool>[static_cast<size_t>(options_.size)]),
      local_pid_(new std::atomic<int32_t>[static_cast<size_t>(options_.size)]),
      local_start_(new std::atomic<uint64_t>[static_cast<size_t>(options_.size)]),
      next_probe_ns_(new std::atomic<int64_t>[static_cast<size_t>(options_.size)]),
      outboxes_(new Outbox[static_cast<size_t>(options_.size)]) {
    peer_records_.push_back(std::make_unique<const Peer>());
    for (int i = 0; i < options_.size; ++i) {
        peers_[i].store(peer_records_.front().get());
        failed_[i].store(false);
        local_pid_[i].store(0);
        local_start_[i].store(0);
        next_probe_ns_[i].store(0);
    }
}

Result<std::shared_ptr<EngineFabric>> EngineFabric::create(std::shared_ptr<KVStore> store,
                                                           EngineFabricOptions options) {
    if (options.size <= 0 || options.rank < 0 || options.rank >= options.size) {
        return InvalidArgument("EngineFabric: rank " + std::to_string(options.rank) +
                               " outside [0, " + std::to_string(options.size) + ")");
    }
    if (options.window_bytes == 0) return InvalidArgument("EngineFabric: window_bytes is 0");
    std::shared_ptr<EngineFabric> fabric(new EngineFabric(std::move(store), std::move(options)));
    MC_RETURN_IF_ERROR(fabric->bootstrap().withContext(
        "bootstrapping rank " + std::to_string(fabric->options_.rank) + " of group '" +
        fabric->options_.group_key + "'"));
    return fabric;
}

Status EngineFabric::startOwnEngine(const std::string& secret) {
    te::EngineOptions eo;
    eo.store = store_;
    eo.segment_name =
        options_.group_key + "/rank" + std::to_string(options_.rank) + "/" + randomHex(4);
    eo.secret = secret;
    eo.key_prefix = options_.group_key + "/te";
    engine_ = std::make_shared<te::TransferEngine>(eo);
    return engine_->init(options_.host_ip, options_.device_filter);
}

Status EngineFabric::bootstrap() {
    const Deadline deadline = Deadline::afterMs(options_.bootstrap_timeout_ms);
    // The group secret guards the control plane as well as a per-group
    // engine, so it is published whichever engine the group uses.
    const std::string secret_key = options_.group_key + "/secret";
    std::string secret;
    if (options_.rank == 0) {
        secret = randomHex(kSecretBytes);
        MC_RETURN_IF_ERROR(store_->set(secret_key, secret));
    } else {
        MC_ASSIGN_OR_RETURN(secret, store_->get(secret_key, deadline));
    }

    if (options_.engine) {
        engine_ = options_.engine;
        external_engine_ = true;
    } else {
        MC_RETURN_IF_ERROR(startOwnEngine(secret));
    }
    prober_ = std::make_unique<LivenessProber>(options_.size, [this](int peer) {
        // Bounded so that one unresponsive host does not hold up probes of
        // the others for long. Only a refused or reset connection is proof
        // of death; a timeout may be a slow link.
        constexpr int64_t kProbeTimeoutMs = 1000;
        const te::SegmentID segment = peerRecord(peer).segment;
        Status st = engine_->probePeerAlive(segment, Deadline::afterMs(kProbeTimeoutMs));
        // connectPeer may have installed a replacement meanwhile; it is not
        // the process found dead.
        if (st.code() != StatusCode::kPeerFailure || peerRecord(peer).segment != segment)
            return;
        MC_LOG(kWarn, "pg") << "rank " << options_.rank << ": rank " << peer
                            << " does not answer liveness probes (" << st.toString()
                            << "); marked failed";
        failed_[peer].store(true);
    });

    MC_ASSIGN_OR_RETURN(void* window, engine_->allocateSharedMemory(options_.window_bytes, "pg-window"));
    window_ = static_cast<uint8_t*>(window);
    if (options_.size > 1) {
        const size_t per_peer =
            std::max(options_.bounce_bytes / static_cast<size_t>(options_.size), kMinOutboxBytes) /
            64 * 64;
        MC_ASSIGN_OR_RETURN(void* bounce,
                            engine_->allocateSharedMemory(
                                per_peer * static_cast<size_t>(options_.size), "pg-bounce"));
        bounce_ = static_cast<uint8_t*>(bounce);
        for (int p = 0; p < options_.size; ++p) {
            outboxes_[p].ring = bounce_ + per_peer * static_cast<size_t>(p);
            outboxes_[p].cap = per_peer;
        }
    }

    segment_name_ = engine_->segmentName();
    MC_RETURN_IF_ERROR(
        store_->set(options_.group_key + "/rank/" + std::to_string(options_.rank), endpoint()));

    {
        std::lock_guard<std::mutex> lock(mu_);
        Peer self;
        self.mapped = window_;
        publishPeer(options_.rank, std::move(self));
    }
    const int connect = options_.connect_ranks < 0 ? options_.size
                                                   : std::min(options_.connect_ranks, options_.size);
    for (int p = 0; p < connect; ++p) {
        if (p == options_.rank) continue;
        MC_ASSIGN_OR_RETURN(std::string info,
                            store_->get(options_.group_key + "/rank/" + std::to_string(p), deadline));
        MC_RETURN_IF_ERROR(connectPeer(p, info, deadline));
    }
    return Status::OK();
}

std::string EngineFabric::endpoint() const {
    std::ostringstream me;
    me << segment_name_ << "#" << reinterpret_cast<uint64_t>(window_);
    return me.str();
}

std::string EngineFabric::peerEndpoint(int peer) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer < 0 || peer >= options_.size)
        return {};
    return peerRecord(peer).endpoint;
}

std::string EngineFabric::segmentOf(const std::string& endpoint) {
    return endpoint.substr(0, endpoint.find('#'));
}

std::vector<std::string> EngineFabric::peerSegments(int ranks) const {
    std::vector<std::string> segments(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
        if (r != options_.rank)
            segments[r] = segmentOf(peerEndpoint(r));
    }
    return segments;
}

void EngineFabric::publishPeer(int peer, Peer record) {
    peer_records_.push_back(std::make_unique<const Peer>(std::move(record)));
    peers_[peer].store(peer_records_.back().get(), std::memory_order_release);
}

Status EngineFabric::connectPeer(int peer, const std::string& endpoint, Deadline deadline) {
    if (peer < 0 || peer >= options_.size || peer == options_.rank) {
        return InvalidArgument("connectPeer: rank " + std::to_string(peer) + " is not a peer");
    }
    const size_t hash = endpoint.rfind('#');
    uint64_t addr = 0;
    if (hash == std::string::npos || hash == 0) {
        return InvalidArgument("connectPeer: malformed endpoint '" + endpoint + "' of rank " +
                               std::to_string(peer));
    }
    try {
        addr = std::stoull(endpoint.substr(hash + 1));
    } catch (const std::exception&) {
        return InvalidArgument("connectPeer: malformed endpoint '" + endpoint + "' of rank " +
                               std::to_string(peer));
    }
    MC_ASSIGN_OR_RETURN(te::SegmentID segment,
                        engine_->openSegment(endpoint.substr(0, hash), deadline));
    // A shared engine may have opened this segment for an earlier group, and
    // its cached descriptor can list a freed window at this very address.
    if (external_engine_)
        MC_RETURN_IF_ERROR(engine_->refreshSegment(segment, deadline));
    auto mapped = engine_->mapRemote(segment, addr, options_.window_bytes);
    // A dead process on this host writes nothing and fails no write of ours
    // (its window stays mapped), so only its pid tells that it is gone.
    // Probing starts only when the pid exists now: a peer in another pid
    // namespace (same boot and network namespace) names a pid we cannot see.
    int32_t pid = 0;
    uint64_t start = 0;
    auto desc = engine_->segmentDesc(segment);
    if (options_.probe_local_pids && desc.ok() && desc->pid > 0 &&
        desc->host_id == te::localHostId()) {
        bool runnable = false;
        if (readProcStat(desc->pid, &runnable, &start) && runnable) pid = desc->pid;
    }
    {
        // Held while the new record is published, so that every put to the
        // peer goes whole to the old connection or whole to the new one.
        Outbox& ob = outboxes_[peer];
        std::unique_lock<std::timed_mutex> out(ob.mu, std::defer_lock);
        if (!lockBy(out, deadline)) {
            return Timeout("connectPeer: a put to rank " + std::to_string(peer) +
                           " still waits for its earlier writes at the deadline");
        }
        // Writes still queued for a previous process of this slot finish
        // first where they can; one that fails later is not held against
        // the new process (InFlight::segment).
        (void)drainLocked(peer, ob, deadline);
        std::lock_guard<std::mutex> lock(mu_);
        Peer p;
        p.segment = segment;
        p.window_addr = addr;
        p.mapped = mapped.ok() ? static_cast<uint8_t*>(mapped.value()) : nullptr;
        p.endpoint = endpoint;
        publishPeer(peer, std::move(p));
        local_pid_[peer].store(0);
        local_start_[peer].store(start);
        next_probe_ns_[peer].store(0);
        local_pid_[peer].store(pid);
        failed_[peer].store(false);
    }
    MC_LOG(kInfo, "pg") << "rank " << options_.rank << " reaches rank " << peer << " via "
                        << (mapped.ok() ? "shared memory" : "the transfer engine");
    return Status::OK();
}

EngineFabric::~EngineFabric() {
    // Bounded drain: in-flight writes read the bounce ring.
    const bool drained = flush(Deadline::afterMs(options_.bootstrap_timeout_ms));
    if (!engine_)
        return;
    if (!external_engine_) {
        engine_->shutdown();
        return;
    }
    // The engine lives on: give back exactly what this fabric took. A bounce
    // ring that writes may still read is leaked rather than freed under them.
    if (window_)
        (void)engine_->freeSharedMemory(window_);
    if (bounce_ && drained)
        (void)engine_->freeSharedMemory(bounce_);
    // Drops the lease last: the engine must outlive the frees above.
    options_.engine.reset();
    engine_.reset();
}

Status EngineFabric::checkPut(int peer, uint64_t offset, size_t len) const {
    if (peer < 0 || peer >= options_.size) {
        return InvalidArgument("peer " + std::to_string(peer) + " outside [0, " +
                               std::to_string(options_.size) + ")");
    }
    if (offset > options_.window_bytes || len > options_.window_bytes - offset) {
        return OutOfRange("put [" + std::to_string(offset) + ", +" + std::to_string(len) +
                          ") outside the " + std::to_string(options_.window_bytes) + "-byte window");
    }
    if (failed_[peer].load(std::memory_order_relaxed)) {
        return PeerFailure("rank " + std::to_string(peer) + " failed");
    }
    return Status::OK();
}

Status EngineFabric::put(int peer, uint64_t offset, const void* src, size_t len,
                         Deadline deadline) {
    MC_RETURN_IF_ERROR(checkPut(peer, offset, len));
    if (len == 0) return Status::OK();
    if (uint8_t* dst = peerRecord(peer).mapped) {
        std::memcpy(dst + offset, src, len);
        return Status::OK();
    }
    return remotePut(peer, offset, src, len, deadline);
}

Status EngineFabric::putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) {
    MC_RETURN_IF_ERROR(checkPut(peer, offset, sizeof(value)));
    if (uint8_t* dst = peerRecord(peer).mapped) {
        std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(dst + offset))
            .store(value, std::memory_order_release);
        return Status::OK();
    }
    // The tcp transport applies one connection's frames in order, so the flag
    // lands after the data put before it.
    return remotePut(peer, offset, &value, sizeof(value), deadline);
}

uint8_t* EngineFabric::peerWindow(int peer) {
    if (peer < 0 || peer >= options_.size) return nullptr;
    return peerRecord(peer).mapped;
}

bool EngineFabric::peerFailed(int peer) const {
    if (peer < 0 || peer >= options_.size) return false;
    // Acquire: a waiter that sees the peer failed re-reads what the peer
    // wrote before it died (fabric_wait.h), and that read must come after.
    if (failed_[peer].load(std::memory_order_acquire))
        return true;
    const int32_t pid = local_pid_[peer].load(std::memory_order_acquire);
    if (pid <= 0 && (peer == options_.rank || peerRecord(peer).segment < 0 || !prober_))
        return false;
    // Waiters poll this in spin loops on several threads: one of them wins
    // the due probe, the others answer from the flag without a syscall.
    const int64_t now = steadyNs();
    int64_t due = next_probe_ns_[peer].load(std::memory_order_relaxed);
    if (now < due) return false;
    const int64_t period = pid > 0 ? kLivenessProbeMs : kRemoteProbeMs;
    if (!next_probe_ns_[peer].compare_exchange_strong(due, now + period * 1000000,
                                                      std::memory_order_relaxed)) {
        return failed_[peer].load(std::memory_order_acquire);
    }
    if (pid <= 0) {
        prober_->request(peer);
        return failed_[peer].load(std::memory_order_acquire);
    }
    bool gone = ::kill(pid, 0) == -1 && errno == ESRCH;
    if (!gone) {
        // kill() still finds a zombie (its parent has not reaped it yet)
        // and a different process that reused the pid.
        bool runnable = false;
        uint64_t start = 0;
        gone = !readProcStat(pid, &runnable, &start) || !runnable ||
               start != local_start_[peer].load(std::memory_order_relaxed);
    }
    // connectPeer may have installed a replacement meanwhile; its pid is not
    // the one found dead.
    if (gone && local_pid_[peer].load(std::memory_order_acquire) == pid) {
        MC_LOG(kWarn, "pg") << "rank " << options_.rank << ": process " << pid << " of rank "
                               << peer << " is gone";
        failed_[peer].store(true);
    }
    return failed_[peer].load(std::memory_order_acquire);
}

void EngineFabric::markPeerFailed(int peer) {
    if (peer >= 0 && peer < options_.size) failed_[peer].store(true);
}

bool EngineFabric::allPeersMapped() const {
    for (int p = 0; p < options_.size; ++p) {
        if (!peerRecord(p).mapped)
            return false;
    }
    return true;
}

Status EngineFabric::remotePut(int peer, uint64_t offset, const void* src, size_t len,
                               Deadline deadline) {
    Outbox& ob = outboxes_[peer];
    const size_t max_piece = ob.cap / 2;
    const auto* bytes = static_cast<const uint8_t*>(src);
    std::unique_lock<std::timed_mutex> lock(ob.mu, std::defer_lock);
    if (!lockBy(lock, deadline)) {
        return Timeout("writing to rank " + std::to_string(peer) +
                       ": another put to it still waits for its earlier writes at the deadline");
    }
    while (len > 0) {
        size_t piece = std::min(len, max_piece);
        MC_RETURN_IF_ERROR(reapLocked(peer, ob, false, deadline));
        // Only this peer's own failed writes fail this put (fabric.h).
        MC_RETURN_IF_ERROR(checkPut(peer, offset, len));
        // Find `piece` contiguous bytes in the ring, waiting for old writes.
        size_t begin = SIZE_MAX;
        while (true) {
            if (ob.inflight.empty()) {
                begin = 0;
            } else {
                size_t tail = ob.inflight.front().bounce_begin;
                size_t head = ob.inflight.back().bounce_begin + ob.inflight.back().bounce_len;
                if (head > tail) {
                    if (ob.cap - head >= piece)
                        begin = head;
                    else if (tail >= piece)
                        begin = 0;
                } else if (tail - head >= piece) {
                    begin = head;
                }
            }
            if (begin != SIZE_MAX)
                break;
            MC_RETURN_IF_ERROR(reapLocked(peer, ob, true, deadline));
            MC_RETURN_IF_ERROR(checkPut(peer, offset, len));
        }
        std::memcpy(ob.ring + begin, bytes, piece);
        te::TransferRequest req;
        req.opcode = te::TransferOpcode::kWrite;
        req.source = ob.ring + begin;
        // Loaded under ob.mu, which connectPeer holds while it drains the
        // writes to the previous connection and publishes the new one: no
        // write to a replaced connection is queued after that drain.
        const Peer& target = peerRecord(peer);
        req.target_id = target.segment;
        req.target_offset = target.window_addr + offset;
        req.length = piece;
        MC_ASSIGN_OR_RETURN(te::BatchID batch, engine_->allocateBatchID(1));
        Status st = engine_->submitTransfer(batch, {req});
        if (!st.ok()) {
            (void)engine_->freeBatchID(batch);
            markPeerFailed(peer);
            return st.withContext("writing to rank " + std::to_string(peer));
        }
        ob.inflight.push_back({batch, begin, piece, target.segment});
        engine_writes_.store(true, std::memory_order_relaxed);
        bytes += piece;
        offset += piece;
        len -= piece;
    }
    return Status::OK();
}

Status EngineFabric::reapLocked(int peer, Outbox& ob, bool block, Deadline deadline) {
    while (!ob.inflight.empty()) {
        InFlight& f = ob.inflight.front();
        if (block) {
            Status st = engine_->waitBatch(f.batch, deadline);
            block = false;
            if (!st.ok() && st.code() == StatusCode::kTimeout) {
                return Timeout("writing to rank " + std::to_string(peer) +
                               ": its staging space is full and its oldest write did not "
                               "complete by the deadline");
            }
        }
        auto status = engine_->getTransferStatus(f.batch, 0);
        if (!status.ok())
            return status.status();
        if (status->state == te::TransferState::kPending)
            return Status::OK();
        const te::SegmentID segment = f.segment;
        (void)engine_->freeBatchID(f.batch);
        ob.inflight.pop_front();
        // Evidence about the peer only (fabric.h), and only about the
        // process the write went to, not a replacement connected since.
        if (status->state == te::TransferState::kFailed && peerRecord(peer).segment == segment) {
            if (!failed_[peer].exchange(true)) {
                MC_LOG(kWarn, "pg") << "rank " << options_.rank << ": a write to rank " << peer
                                    << " failed (" << status->error.toString()
                                    << "); marked failed";
            }
        }
    }
    return Status::OK();
}

bool EngineFabric::flush(Deadline deadline) {
    if (!engine_writes_.load(std::memory_order_relaxed))
        return true;
    bool drained = true;
    for (int p = 0; p < options_.size; ++p) {
        Outbox& ob = outboxes_[p];
        std::unique_lock<std::timed_mutex> lock(ob.mu, std::defer_lock);
        if (!lockBy(lock, deadline)) {
            drained = false;
            continue;
        }
        drained = drainLocked(p, ob, deadline) && drained;
    }
    return drained;
}

bool EngineFabric::drainLocked(int peer, Outbox& ob, Deadline deadline) {
    while (!ob.inflight.empty()) {
        if (!reapLocked(peer, ob, true, deadline).ok() && deadline.expired())
            return false;
    }
    return true;
}

}  // namespace mooncake::pg
