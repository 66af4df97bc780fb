// Inputs common to both state machines. Neither reads a clock: the host
// passes its monotonic time (any origin, one origin per process) in every
// event, and deadlines are computed from it.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include "mooncake-pg/control_plane/messages.h"
#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::pg::control_plane {

using Millis = std::chrono::milliseconds;

// A message the host received and parsed.
struct Received {
    Millis now{0};
    ControlMessage message;
};

// Time passed. The host sends one at (or soon after) nextDeadline(), and may
// send more; extra ticks are harmless.
struct Tick {
    Millis now{0};
};

// Something the host should log (subsystem "coord"); never needed for
// correctness.
struct Log {
    LogLevel level = LogLevel::kInfo;
    std::string text;
};

// The handleBytes of both state machines: bytes that parse are handled as a
// Received event; bytes that do not must not stop the machine (a peer or a
// stranger sent them), so time still advances (a Tick) and a warning says
// why they were dropped.
template <typename Machine>
auto handleMessageBytes(Machine& machine, Millis now, std::string_view bytes) {
    auto parsed = parseControlMessage(bytes);
    if (!parsed.ok()) {
        auto out = machine.handle(Tick{now});
        out.push_back(
            Log{LogLevel::kWarn, "dropped undecodable message: " + parsed.status().message()});
        return out;
    }
    return machine.handle(Received{now, std::move(parsed).value()});
}

}  // namespace mooncake::pg::control_plane
