// The accepting socket of the TCP transport. Peers connect to it; every
// accepted socket is handed to the owner, which runs the target side.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/transport/tcp/event_loop.h"

namespace mooncake::te::tcp {

// Socket helpers shared by the listener and outgoing connections.
Status setSocketOptions(int fd);
std::string describeSockaddr(const void* addr, unsigned len);

class Listener final : public EventHandler {
public:
    // fd is non-blocking, close-on-exec and owned by the callee from then on;
    // peer is "ip:port" for messages.
    using AcceptFn = std::function<void(int fd, std::string peer)>;

    Listener(EventLoop* loop, AcceptFn on_accept) : loop_(loop), on_accept_(std::move(on_accept)) {}
    ~Listener() override { close(); }

    // Binds to `host` (numeric IPv4/IPv6) on an ephemeral port and listens.
    Status open(const std::string& host);
    uint16_t port() const { return port_; }
    void close();

    void handleEvents(uint32_t events) override;

private:
    EventLoop* loop_;
    AcceptFn on_accept_;
    int fd_ = -1;
    uint16_t port_ = 0;
};

}  // namespace mooncake::te::tcp
