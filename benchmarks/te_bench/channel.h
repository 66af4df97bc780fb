// What the two processes share: the control channel (lines over a socket
// pair), the raw loopback socket's I/O and options, and engine creation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"

namespace mooncake::te::bench {

// One phase at the largest sizes stays well below.
inline constexpr int64_t kControlTimeoutMs = 600000;

class Control {
public:
    explicit Control(int fd) : fd_(fd) {}
    int fd() const { return fd_; }
    bool send(const std::string& line);
    // The next line, or "" on EOF/timeout.
    std::string recv();

private:
    int fd_;
    std::string buf_;
};

bool sendAll(int fd, const char* p, uint64_t n);
bool recvAll(int fd, char* p, uint64_t n);

// As the engine sets its sockets, so the comparison is like for like.
bool setRawOptions(int fd, const std::string& congestion);

// The congestion control new sockets get.
std::string systemCongestion();

std::unique_ptr<TransferEngine> makeEngine(const std::string& dir, const std::string& name,
                                           bool force_tcp, Status* st);

}  // namespace mooncake::te::bench
