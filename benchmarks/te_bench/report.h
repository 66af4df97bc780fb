// The JSON report of a run: the settings, each pair's method, the samples,
// the ratios and the errors.
#pragma once

#include <string>
#include <vector>

#include "benchmarks/te_bench/measure.h"
#include "benchmarks/te_bench/options.h"

namespace mooncake::te::bench {

std::string report(const Options& o, const std::vector<Sample>& samples,
                   const std::vector<std::string>& errors);

}  // namespace mooncake::te::bench
