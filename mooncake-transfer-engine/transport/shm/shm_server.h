// The owner side of the shm transport: one thread serving this engine's
// shared allocations (memfds) to same-host peers that present the group
// secret. It multiplexes all connections with poll() so a client that
// connects and stays silent cannot hold up anyone else, and it never throws.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/shm/fd_passing.h"
#include "mooncake-transfer-engine/transport/shm/shm_protocol.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

class ShmServer {
public:
    // Listens on the abstract socket @`name` and starts serving.
    static Result<std::unique_ptr<ShmServer>> start(TransportHost* host, const std::string& name);

    ~ShmServer();
    ShmServer(const ShmServer&) = delete;
    ShmServer& operator=(const ShmServer&) = delete;

    // Wakes the thread through an eventfd, joins it and releases the socket
    // name. Idempotent.
    void stop();

private:
    struct Client;

    ShmServer(TransportHost* host, UniqueFd listener, UniqueFd wake);

    void run() noexcept;
    // One poll round; false once stop() was asked.
    bool step();
    void acceptClients();
    // Handles one readable client; false when the connection should close.
    bool serve(Client& client);
    ShmReply answer(const ShmRequest& request, int client_pid, UniqueFd* fd_out);

    TransportHost* host_;
    UniqueFd listener_;
    UniqueFd wake_;  // eventfd; readable once stop() is called
    std::thread thread_;
    std::mutex stop_mu_;
    bool stopped_ = false;

    // Touched by the serving thread only.
    std::vector<std::unique_ptr<Client>> clients_;
    std::chrono::steady_clock::time_point accept_paused_until_{};
};

}  // namespace mooncake::te
