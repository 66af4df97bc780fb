// The parent process: initiates every transfer, block by block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "benchmarks/te_bench/channel.h"
#include "benchmarks/te_bench/measure.h"
#include "benchmarks/te_bench/options.h"

namespace mooncake::te::bench {

// Connects to the child's raw socket on `raw_port`, opens an initiator per
// target the child reports, runs every block of the schedule and returns its
// samples and errors; the raw socket is closed and the initiators are shut
// down by the time it returns.
void runParent(const Options& o, const std::string& dir, Control& ctl, uint16_t raw_port,
               std::vector<Sample>* samples, std::vector<std::string>* errors);

}  // namespace mooncake::te::bench
