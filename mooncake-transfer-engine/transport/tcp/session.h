// The two protocol roles on top of Connection.
//
// ClientSession (initiator): one per peer segment. Connects, presents the
// group secret in HELLO, waits for HELLO_ACK, then pipelines requests: WRITEs
// stream straight from the caller's buffer, READ data lands straight in it.
//
// ServerSession (target): one per accepted socket. Admits the peer only after
// a HELLO with the right secret, bounds-checks every request against the
// registry before touching memory, and applies frames in arrival order.
//
// Both live on the event loop thread only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/transport/tcp/connection.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te::tcp {

// A probe() caller blocked on its PONG.
class ProbeWaiter {
public:
    void complete(Status status);
    // The outcome, or kTimeout once `deadline` passes.
    Status wait(Deadline deadline, const std::string& peer);

private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    Status status_;
};

// One request as the loop tracks it: a transfer task or a probe.
struct Op {
    std::shared_ptr<TransferTask> task;  // null for a probe
    std::shared_ptr<ProbeWaiter> probe;
    std::shared_ptr<const SegmentDesc> peer;
    Deadline deadline = Deadline::never();
    uint64_t received = 0;  // READ bytes landed so far

    bool isRead() const { return task && task->request().opcode == TransferOpcode::kRead; }
    void finish(Status status) const;
};

class ClientSession final : public Connection::Delegate {
public:
    // Called once the session is closed; the owner frees it after the
    // current loop iteration (the connection may still be on the stack).
    using ClosedFn = std::function<void(ClientSession*)>;

    ClientSession(EventLoop* loop, TransportHost* host, const SegmentDesc& peer,
                  ClosedFn on_closed);
    ~ClientSession() override;

    // Starts the non-blocking connect; the handshake must finish within
    // `handshake_deadline`. On error nothing is left to clean up.
    Status connect(Deadline handshake_deadline);
    void enqueue(Op op);
    void flush();
    // Fails overdue requests with kTimeout; gives up a late handshake.
    void sweep();
    void close(const Status& why);
    // Whether sweep() has anything to watch.
    bool hasDeadlines() const { return !ready_ || !waiting_.empty() || !pending_.empty(); }
    const std::string& label() const { return label_; }

    void onConnected(Connection* conn) override;
    PayloadSink onHeader(Connection* conn, const FrameHeader& h) override;
    void onFrame(Connection* conn, const FrameHeader& h, std::string_view small) override;
    void onClosed(Connection* conn, const Status& why) override;

private:
    void dispatch(Op op);
    void protocolError(const std::string& what);

    EventLoop* loop_;
    TransportHost* host_;
    std::string tcp_host_;
    uint16_t tcp_port_;
    std::string label_;  // "segment 'x' at host:port"
    ClosedFn on_closed_;
    std::unique_ptr<Connection> conn_;
    Deadline handshake_deadline_ = Deadline::never();
    bool ready_ = false;
    bool closed_ = false;
    uint64_t next_id_ = 1;
    std::deque<Op> waiting_;                    // submitted before HELLO_ACK
    std::unordered_map<uint64_t, Op> pending_;  // on the wire, by request id
};

class ServerSession final : public Connection::Delegate {
public:
    using ClosedFn = std::function<void(ServerSession*)>;

    ServerSession(EventLoop* loop, TransportHost* host, int fd, std::string peer,
                  Deadline hello_deadline, ClosedFn on_closed);
    ~ServerSession() override;

    Status start();
    // Drops a peer that has not said HELLO in time.
    void sweep();
    void close(const Status& why);
    bool hasDeadlines() const { return !authenticated_; }
    // Fails the WRITE landing in the region at `region_addr`, if any: its
    // remaining payload is drained unapplied and the peer gets an error.
    void abortWriteInto(uint64_t region_addr, const std::string& segment_name);

    void onConnected(Connection* conn) override { (void)conn; }
    PayloadSink onHeader(Connection* conn, const FrameHeader& h) override;
    void onFrame(Connection* conn, const FrameHeader& h, std::string_view small) override;
    void onClosed(Connection* conn, const Status& why) override;

private:
    void reject(StatusCode code, const std::string& reason);
    void reply(FrameType type, uint64_t request_id, StatusCode code = StatusCode::kOk,
               std::string message = {});

    TransportHost* host_;
    std::string peer_;
    Deadline hello_deadline_;
    ClosedFn on_closed_;
    std::unique_ptr<Connection> conn_;
    bool authenticated_ = false;
    bool closed_ = false;
    std::string peer_segment_;
    // A request whose range failed validation: its remaining slices are
    // drained unapplied. Its first slice checks the whole range, so an
    // out-of-range request writes nothing at all.
    uint64_t failed_request_ = 0;
    // The WRITE frame whose payload is landing now (one at a time: frames
    // are applied in order) holds its region until the frame is complete,
    // so the region cannot be unregistered under the copy.
    RegionUse write_use_;
    uint64_t write_request_ = 0;
};

}  // namespace mooncake::te::tcp
