// Inputs common to both state machines. Neither reads a clock: the host
// passes its monotonic time (any origin, one origin per process) in every
// event, and deadlines are computed from it.
#pragma once

#include <chrono>
#include <string>

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

}  // namespace mooncake::pg::control_plane
