// TCP transport: reaches any peer that publishes a tcp_port. One event-loop
// thread owns every socket. Per peer segment there is one outgoing connection
// (ClientSession) on which requests are pipelined; every accepted connection
// is served by a ServerSession. Wire format: frame.h; roles: session.h.
#include "mooncake-transfer-engine/transport/tcp/tcp_transport.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <vector>

#include "mooncake-transfer-engine/common/env.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/transport/tcp/event_loop.h"
#include "mooncake-transfer-engine/transport/tcp/listener.h"
#include "mooncake-transfer-engine/transport/tcp/session.h"

namespace mooncake::te {
namespace tcp {
namespace {

// Connect + HELLO/HELLO_ACK to a peer; also how long an accepted socket may
// stay silent before its HELLO.
MC_ENV_INT(TcpConnectTimeoutMs, "MC_TCP_CONNECT_TIMEOUT_MS", 10000)
// From submit() to completion of one request.
MC_ENV_INT(TcpRequestTimeoutMs, "MC_TCP_REQUEST_TIMEOUT_MS", 30000)

// How often the loop looks for overdue requests while any are pending: a
// tenth of the shortest timeout, so a deadline is enforced within ~10%.
std::chrono::milliseconds sweepInterval() {
    int64_t shortest = std::min(envTcpConnectTimeoutMs(), envTcpRequestTimeoutMs());
    return std::chrono::milliseconds(std::clamp<int64_t>(shortest / 10, 1, 50));
}

std::string peerKey(const SegmentDesc& peer) {
    // A restarted peer listens on a new port and gets a fresh connection.
    return peer.name + "|" + peer.tcp_host + "|" + std::to_string(peer.tcp_port);
}

class TcpTransport final : public Transport, private EventLoop::Hooks {
public:
    TcpTransport() = default;
    ~TcpTransport() override { shutdown(); }

    const char* name() const override { return "tcp"; }
    Status start(TransportHost* host, SegmentDesc* local) override;
    Status exportRegion(const LocalRegion& region, RegionDesc* desc) override {
        (void)region, (void)desc;
        return Status::OK();  // tcp reaches any registered range without export data
    }
    // Host memory only: the serving side copies with plain loads and stores,
    // which device memory does not take.
    bool canReach(const SegmentDesc& peer, const RegionDesc& region) const override {
        return peer.tcp_port != 0 && region.location == "cpu";
    }
    void submit(const std::shared_ptr<TransferTask>& task) override;
    void abortRemoteAccess(const LocalRegion& region) override;
    Status probe(const SegmentDesc& peer, Deadline deadline) override;
    void shutdown() override;

private:
    // Called from any thread; false once shut down (the op is then the caller's).
    bool post(Op op);
    void onWakeup() override;
    int onIteration() override;
    ClientSession* route(Op op);
    void onAccept(int fd, std::string peer);
    void retire(ClientSession* session);
    void retire(ServerSession* session);

    // Declared first so it outlives the sockets below that deregister from it.
    EventLoop loop_;
    TransportHost* host_ = nullptr;
    std::unique_ptr<Listener> listener_;

    std::mutex mu_;  // guards the four below
    bool started_ = false;
    bool stopped_ = false;
    std::vector<Op> inbox_;
    std::vector<uint64_t> aborted_regions_;  // by address, for the loop

    // Loop thread only (or the shutdown caller once the loop has stopped).
    std::map<std::string, std::unique_ptr<ClientSession>> clients_;
    std::unordered_map<ServerSession*, std::unique_ptr<ServerSession>> servers_;
    // Closed sessions, freed after the loop iteration that closed them: their
    // connection's handler may still be on the stack when they close.
    std::vector<std::unique_ptr<ClientSession>> dead_clients_;
    std::vector<std::unique_ptr<ServerSession>> dead_servers_;
    Deadline::Clock::time_point next_sweep_{};
};

Status TcpTransport::start(TransportHost* host, SegmentDesc* local) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (started_ || stopped_)
            return InvalidArgument("tcp transport started twice");
    }
    host_ = host;
    MC_RETURN_IF_ERROR(loop_.open());
    listener_ = std::make_unique<Listener>(
        &loop_, [this](int fd, std::string peer) { onAccept(fd, std::move(peer)); });
    MC_RETURN_IF_ERROR(listener_->open(host->hostIp()));
    MC_RETURN_IF_ERROR(loop_.run(this, "mc-tcp"));
    {
        std::lock_guard<std::mutex> lock(mu_);
        started_ = true;
    }
    local->tcp_host = host->hostIp();
    local->tcp_port = listener_->port();
    MC_LOG(kDebug, "tcp") << "segment '" << host->segmentName() << "' listening on "
                          << local->tcp_host << ":" << local->tcp_port;
    return Status::OK();
}

bool TcpTransport::post(Op op) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!started_ || stopped_)
            return false;
        inbox_.push_back(std::move(op));
    }
    loop_.wakeup();
    return true;
}

void TcpTransport::submit(const std::shared_ptr<TransferTask>& task) {
    Op op;
    op.task = task;
    op.peer = task->peerPtr();
    op.deadline = Deadline::afterMs(envTcpRequestTimeoutMs());
    if (!post(std::move(op)))
        task->complete(Aborted("tcp transport is not running"));
}

void TcpTransport::abortRemoteAccess(const LocalRegion& region) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        // Once stopped, every session is closed and holds no region.
        if (!started_ || stopped_)
            return;
        aborted_regions_.push_back(region.addr);
    }
    loop_.wakeup();
}

Status TcpTransport::probe(const SegmentDesc& peer, Deadline deadline) {
    const std::string label =
        "segment '" + peer.name + "' at " + peer.tcp_host + ":" + std::to_string(peer.tcp_port);
    if (peer.tcp_port == 0)
        return Unavailable(label + " has no tcp listener");
    auto waiter = std::make_shared<ProbeWaiter>();
    Op op;
    op.probe = waiter;
    op.peer = std::make_shared<const SegmentDesc>(peer);
    // A caller waiting forever still must not leave the PING queued forever.
    Deadline cap = Deadline::afterMs(envTcpRequestTimeoutMs());
    op.deadline = deadline.at() < cap.at() ? deadline : cap;
    if (!post(std::move(op)))
        return Aborted("tcp transport is not running");
    return waiter->wait(deadline, label);
}

void TcpTransport::onWakeup() {
    std::vector<Op> ops;
    std::vector<uint64_t> aborted;
    {
        std::lock_guard<std::mutex> lock(mu_);
        ops.swap(inbox_);
        aborted.swap(aborted_regions_);
    }
    if (!aborted.empty()) {
        // A snapshot: the error reply may close (and so retire) a session.
        std::vector<ServerSession*> servers;
        for (auto& [raw, s] : servers_)
            servers.push_back(raw);
        for (uint64_t region : aborted) {
            for (ServerSession* s : servers)
                s->abortWriteInto(region, host_->segmentName());
        }
    }
    std::vector<ClientSession*> touched;
    for (auto& op : ops) {
        ClientSession* s = route(std::move(op));
        if (s && (touched.empty() || touched.back() != s))
            touched.push_back(s);
    }
    // One flush per session after the whole batch lets small requests share
    // a sendmsg() instead of paying one each.
    for (ClientSession* s : touched)
        s->flush();
}

ClientSession* TcpTransport::route(Op op) {
    std::string key = peerKey(*op.peer);
    auto it = clients_.find(key);
    if (it == clients_.end()) {
        auto session = std::make_unique<ClientSession>(&loop_, host_, *op.peer,
                                                       [this](ClientSession* s) { retire(s); });
        Status st = session->connect(Deadline::afterMs(envTcpConnectTimeoutMs()));
        if (!st.ok()) {
            MC_LOG(kDebug, "tcp") << st.toString();
            op.finish(st);
            return nullptr;
        }
        it = clients_.emplace(std::move(key), std::move(session)).first;
    }
    ClientSession* s = it->second.get();
    s->enqueue(std::move(op));
    return s;
}

void TcpTransport::onAccept(int fd, std::string peer) {
    auto session = std::make_unique<ServerSession>(&loop_, host_, fd, peer,
                                                   Deadline::afterMs(envTcpConnectTimeoutMs()),
                                                   [this](ServerSession* s) { retire(s); });
    Status st = session->start();
    if (!st.ok()) {
        MC_LOG(kWarn, "tcp") << "dropping connection from " << peer << ": " << st.toString();
        return;
    }
    ServerSession* raw = session.get();
    servers_.emplace(raw, std::move(session));
}

void TcpTransport::retire(ClientSession* session) {
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
        if (it->second.get() == session) {
            dead_clients_.push_back(std::move(it->second));
            clients_.erase(it);
            return;
        }
    }
}

void TcpTransport::retire(ServerSession* session) {
    auto it = servers_.find(session);
    if (it == servers_.end())
        return;
    dead_servers_.push_back(std::move(it->second));
    servers_.erase(it);
}

int TcpTransport::onIteration() {
    dead_clients_.clear();
    dead_servers_.clear();
    auto now = Deadline::Clock::now();
    if (now >= next_sweep_) {
        next_sweep_ = now + sweepInterval();
        // Snapshots: a sweep may close (and so retire) the session it checks.
        std::vector<ClientSession*> clients;
        for (auto& [key, s] : clients_)
            clients.push_back(s.get());
        for (ClientSession* s : clients)
            s->sweep();
        std::vector<ServerSession*> servers;
        for (auto& [raw, s] : servers_)
            servers.push_back(raw);
        for (ServerSession* s : servers)
            s->sweep();
    }
    bool watching = false;
    for (auto& [key, s] : clients_)
        watching = watching || s->hasDeadlines();
    for (auto& [raw, s] : servers_)
        watching = watching || s->hasDeadlines();
    if (!watching)
        return -1;  // idle: sleep until a socket or submit() wakes us
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_sweep_ - now).count();
    return static_cast<int>(std::clamp<int64_t>(wait, 1, 1000));
}

void TcpTransport::shutdown() {
    std::vector<Op> inbox;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopped_)
            return;
        stopped_ = true;
        inbox.swap(inbox_);
    }
    loop_.stop();
    // The loop thread is gone: its state belongs to this thread now.
    const Status why =
        Aborted("tcp transport of segment '" + (host_ ? host_->segmentName() : "") + "' shut down");
    for (auto& op : inbox)
        op.finish(why);
    std::vector<ClientSession*> clients;
    for (auto& [key, s] : clients_)
        clients.push_back(s.get());
    for (ClientSession* s : clients)
        s->close(why);
    std::vector<ServerSession*> servers;
    for (auto& [raw, s] : servers_)
        servers.push_back(raw);
    for (ServerSession* s : servers)
        s->close(why);
    dead_clients_.clear();
    dead_servers_.clear();
    clients_.clear();
    servers_.clear();
    listener_.reset();
}

}  // namespace
}  // namespace tcp

std::unique_ptr<Transport> createTcpTransport() {
    return std::make_unique<tcp::TcpTransport>();
}

}  // namespace mooncake::te
