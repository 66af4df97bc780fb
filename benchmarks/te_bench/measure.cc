#include "benchmarks/te_bench/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace mooncake::te::bench {

Status runBlock(const Block& b, const Op& op, bool per_block, std::vector<double>* ns) {
    const int total = b.warmup + b.iters;
    double sum = 0;
    for (int i = 0; i < total; ++i) {
        MC_ASSIGN_OR_RETURN(Clock::duration d, op(i == total - 1));
        if (i < b.warmup)
            continue;
        const double v = std::chrono::duration<double, std::nano>(d).count();
        if (per_block)
            sum += v;
        else
            ns->push_back(v);
    }
    if (per_block && b.iters > 0)
        ns->push_back(sum / b.iters);
    return Status::OK();
}

Sample summarize(const std::string& transport, uint64_t size, int iters, std::vector<double> ns) {
    double total = 0;
    for (double v : ns)
        total += v;
    std::sort(ns.begin(), ns.end());
    auto rank = [&](double q) {
        size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(ns.size())));
        return ns[std::clamp<size_t>(k, 1, ns.size()) - 1];
    };
    const double bits = 8.0 * static_cast<double>(size);
    Sample s;
    s.transport = transport;
    s.size = size;
    s.iters = iters;
    s.p50_us = rank(0.5) / 1e3;
    s.p99_us = rank(0.99) / 1e3;
    s.gbps = bits / rank(0.5);                                    // bits per ns = Gbit/s
    s.gbps_mean = bits * static_cast<double>(ns.size()) / total;  // per-block means weigh alike
    std::fprintf(stderr, "%-15s %10llu B  p50 %10.2f us  p99 %10.2f us  %8.2f Gbit/s  (%d iters)\n",
                 transport.c_str(), static_cast<unsigned long long>(size), s.p50_us, s.p99_us,
                 s.gbps, s.iters);
    return s;
}

}  // namespace mooncake::te::bench
