// Timing one side of a pair: the buffers, one iteration (Op), a block of
// iterations, and the summary of one transport at one size (Sample).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/te_bench/options.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::bench {

using Clock = std::chrono::steady_clock;

struct Sample {
    std::string transport;
    uint64_t size = 0;
    int iters = 0;
    double p50_us = 0, p99_us = 0, gbps = 0, gbps_mean = 0;
};

// Page-aligned, pre-faulted memory, so no phase pays first-touch costs.
struct Buffer {
    explicit Buffer(uint64_t n)
        : data(static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
        if (data)
            std::memset(data, 0x5c, n);
    }
    ~Buffer() { std::free(data); }
    char* data;
};

// One iteration; returns how long its measured part took. `last` is set on
// the final iteration of a block, which then drains what is still in flight,
// outside the measured part.
using Op = std::function<Result<Clock::duration>(bool last)>;

// Appends the time of every timed iteration to `ns`; with `per_block`, one
// value instead: the mean over the block. Streams need that: completions
// arrive in bursts, so single intervals say little about the rate.
Status runBlock(const Block& b, const Op& op, bool per_block, std::vector<double>* ns);

// p50, p99 and Gbit/s of the iteration times `ns`; prints them as one line
// on stderr.
Sample summarize(const std::string& transport, uint64_t size, int iters, std::vector<double> ns);

}  // namespace mooncake::te::bench
