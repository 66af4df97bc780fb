// The child process: owns the target memory of the engine transports and
// the receiving end of the raw socket.
#pragma once

#include <string>

#include "benchmarks/te_bench/channel.h"
#include "benchmarks/te_bench/options.h"

namespace mooncake::te::bench {

// Opens a target per engine transport and sends the parent its address,
// mirrors the raw socket's schedule, and returns (the exit code) once the
// parent sends "exit" or the control channel closes.
int childMain(Control& ctl, int listen_fd, const std::string& dir, const Options& o);

}  // namespace mooncake::te::bench
