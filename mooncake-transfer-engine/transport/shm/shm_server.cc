#include "mooncake-transfer-engine/transport/shm/shm_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/random.h"

namespace mooncake::te {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBacklog = 128;
// Bounds the file descriptors a crowd of clients can pin in this process.
constexpr size_t kMaxClients = 256;
// A connection that sends nothing for this long is dropped; clients open a
// connection per call, so only a stuck or hostile one gets near it.
constexpr auto kIdleTimeout = std::chrono::seconds(10);
// Replies are a few bytes; a client that does not drain its socket for this
// long is dropped rather than allowed to stall the serving thread.
constexpr int64_t kReplyTimeoutMs = 100;
// After EMFILE/ENFILE the listener stays readable; back off instead of spinning.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
    return a < b + blen && b < a + alen;
}

}  // namespace

struct ShmServer::Client {
    UniqueFd fd;
    int pid = -1;  // for log lines
    Clock::time_point idle_deadline;
};

Result<std::unique_ptr<ShmServer>> ShmServer::start(TransportHost* host, const std::string& name) {
    MC_ASSIGN_OR_RETURN(UniqueFd listener, listenAbstract(name, kBacklog));
    UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake.valid())
        return Internal(std::string("eventfd: ") + std::strerror(errno));
    std::unique_ptr<ShmServer> server(new ShmServer(host, std::move(listener), std::move(wake)));
    try {
        server->thread_ = std::thread([s = server.get()] { s->run(); });
    } catch (const std::exception& e) {
        return Internal(std::string("starting the shm server thread: ") + e.what());
    }
    return server;
}

ShmServer::ShmServer(TransportHost* host, UniqueFd listener, UniqueFd wake)
    : host_(host), listener_(std::move(listener)), wake_(std::move(wake)) {}

ShmServer::~ShmServer() {
    stop();
}

void ShmServer::stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_)
        return;
    stopped_ = true;
    uint64_t one = 1;
    // The eventfd counter cannot overflow from one write, so this cannot fail
    // in a way that would leave the thread asleep.
    (void)!::write(wake_.get(), &one, sizeof(one));
    if (thread_.joinable())
        thread_.join();
    clients_.clear();
    listener_.reset();
}

void ShmServer::run() noexcept {
    while (true) {
        try {
            if (!step())
                return;
        } catch (const std::exception& e) {
            // Only allocation failure can get here; shedding the connections
            // frees what they hold and keeps the server alive.
            MC_LOG(kError, "shm") << "shm server: " << e.what() << "; dropping " << clients_.size()
                                  << " connections";
            clients_.clear();
        } catch (...) {
            MC_LOG(kError, "shm") << "shm server: unknown exception; dropping connections";
            clients_.clear();
        }
    }
}

bool ShmServer::step() {
    const Clock::time_point now = Clock::now();
    std::vector<pollfd> fds;
    fds.reserve(clients_.size() + 2);
    fds.push_back({wake_.get(), POLLIN, 0});
    const bool accepting = now >= accept_paused_until_;
    fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
    Clock::time_point wake_at = accepting ? Clock::time_point::max() : accept_paused_until_;
    for (const auto& c : clients_) {
        fds.push_back({c->fd.get(), POLLIN, 0});
        wake_at = std::min(wake_at, c->idle_deadline);
    }
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake_at - now).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 0, INT32_MAX));
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
        if (errno == EINTR)
            return true;
        MC_LOG(kError, "shm") << "shm server poll: " << std::strerror(errno) << "; stopping";
        return false;
    }
    if (fds[0].revents)
        return false;

    const Clock::time_point after = Clock::now();
    std::vector<std::unique_ptr<Client>> kept;
    kept.reserve(clients_.size());
    for (size_t i = 0; i < clients_.size(); ++i) {
        Client& c = *clients_[i];
        short ev = fds[i + 2].revents;
        bool keep = true;
        if (ev & POLLIN) {
            keep = serve(c);
        } else if (ev & (POLLHUP | POLLERR | POLLNVAL)) {
            keep = false;
        } else if (after >= c.idle_deadline) {
            MC_LOG(kDebug, "shm") << "shm server: dropping idle connection from pid " << c.pid;
            keep = false;
        }
        if (keep)
            kept.push_back(std::move(clients_[i]));
    }
    clients_ = std::move(kept);
    if (fds[1].revents & POLLIN)
        acceptClients();
    return true;
}

void ShmServer::acceptClients() {
    while (true) {
        UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd.valid()) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED)
                continue;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                MC_LOG(kWarn, "shm")
                    << "shm server accept: " << std::strerror(err) << "; pausing accepts";
                accept_paused_until_ = Clock::now() + kAcceptPause;
            }
            return;  // EAGAIN: the backlog is drained
        }
        int pid = peerPid(fd.get());
        if (clients_.size() >= kMaxClients) {
            MC_LOG(kWarn, "shm") << "shm server: " << clients_.size()
                                 << " connections open; refusing pid " << pid;
            continue;  // closing the socket tells the client
        }
        auto c = std::make_unique<Client>();
        c->fd = std::move(fd);
        c->pid = pid;
        c->idle_deadline = Clock::now() + kIdleTimeout;
        clients_.push_back(std::move(c));
    }
}

bool ShmServer::serve(Client& client) {
    // poll() said readable, so an already-expired deadline only turns a
    // spurious wake-up into kTimeout instead of blocking.
    auto packet = recvPacket(client.fd.get(), kMaxShmRequestBytes, Deadline::afterMs(0));
    if (!packet.ok()) {
        return packet.status().code() == StatusCode::kTimeout;
    }
    client.idle_deadline = Clock::now() + kIdleTimeout;
    UniqueFd reply_fd;
    ShmReply reply;
    bool keep = true;
    auto request = decodeShmRequest(packet->bytes);
    if (!request.ok() || packet->fd.valid()) {
        MC_LOG(kWarn, "shm") << "shm server: malformed request from pid " << client.pid;
        reply.code = ShmReplyCode::kBadRequest;
        keep = false;
    } else {
        reply = answer(request.value(), client.pid, &reply_fd);
        keep = reply.code != ShmReplyCode::kDenied;
    }
    Status st = sendPacket(client.fd.get(), encodeShmReply(reply), reply_fd.get(),
                           Deadline::afterMs(kReplyTimeoutMs));
    if (!st.ok()) {
        MC_LOG(kDebug, "shm") << "shm server: reply to pid " << client.pid
                              << " failed: " << st.toString();
        return false;
    }
    return keep;
}

ShmReply ShmServer::answer(const ShmRequest& request, int client_pid, UniqueFd* fd_out) {
    ShmReply reply;
    if (!constantTimeEquals(request.secret, host_->secret())) {
        MC_LOG(kWarn, "shm") << "segment " << host_->segmentName()
                             << ": refused shm request with a wrong group secret from pid "
                             << client_pid;
        reply.code = ShmReplyCode::kDenied;
        return reply;
    }
    if (request.op == ShmOp::kPing)
        return reply;

    MemoryRegistry& memory = host_->memory();
    auto alloc = memory.sharedById(request.alloc_id);
    // Only allocations the application registered as remotely accessible are
    // handed out; an allocation kept private stays private.
    bool exposed = false;
    if (alloc) {
        for (const auto& r : memory.regions()) {
            if (r.remote_accessible && overlaps(r.addr, r.length, alloc->addr, alloc->length)) {
                exposed = true;
                break;
            }
        }
    }
    if (!exposed) {
        reply.code = ShmReplyCode::kNotFound;
        return reply;
    }
    UniqueFd dup(::fcntl(alloc->fd, F_DUPFD_CLOEXEC, 0));
    if (!dup.valid()) {
        MC_LOG(kWarn, "shm") << "shm server: dup of allocation " << request.alloc_id
                             << " failed: " << std::strerror(errno);
        reply.code = ShmReplyCode::kInternal;
        return reply;
    }
    // freeShared() closes the memfd and forgets the id under one lock, so if
    // the id is still known after the dup, the dup is of the right file and
    // not of a recycled descriptor number.
    auto again = memory.sharedById(request.alloc_id);
    if (!again || again->fd != alloc->fd) {
        reply.code = ShmReplyCode::kNotFound;
        return reply;
    }
    reply.length = alloc->length;
    *fd_out = std::move(dup);
    return reply;
}

}  // namespace mooncake::te
