#include "benchmarks/te_bench/report.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "benchmarks/te_bench/channel.h"

namespace mooncake::te::bench {
namespace {

std::string jsonEscape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '"' || c == '\\')
            out += '\\', out += c;
        else if (static_cast<unsigned char>(c) < 0x20)
            out += ' ';
        else
            out += c;
    }
    return out;
}

std::string num(double v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.4g", v);
    return b;
}

}  // namespace

std::string report(const Options& o, const std::vector<Sample>& samples,
                   const std::vector<std::string>& errors) {
    std::map<std::pair<std::string, uint64_t>, double> gbps;
    for (const auto& s : samples)
        gbps[{s.transport, s.size}] = s.gbps;
    auto ratio = [&](const char* a, const char* b, uint64_t size) -> std::string {
        auto x = gbps.find({a, size}), y = gbps.find({b, size});
        if (x == gbps.end() || y == gbps.end() || y->second <= 0)
            return "null";
        return num(x->second / y->second);
    };
    std::string j =
        "{\"benchmark\":\"te_bench\",\"config\":{\"min_bytes\":" + std::to_string(o.min_bytes) +
        ",\"max_bytes\":" + std::to_string(o.max_bytes) + ",\"iters\":" + std::to_string(o.iters) +
        ",\"warmup\":" + std::to_string(o.warmup) + ",\"rounds\":" + std::to_string(o.rounds) +
        ",\"parent_cpu\":" + std::to_string(o.parent_cpu) +
        ",\"child_cpu\":" + std::to_string(o.child_cpu) + ",\"congestion\":\"" +
        jsonEscape(o.congestion.empty() ? systemCongestion() : o.congestion) + "\"" +
        ",\"depth\":" + std::to_string(o.depth) +
        ",\"gbps_unit\":\"Gbit/s\",\"gbps_basis\":\"p50 iteration time\"," +
        "\"order\":\"per size, each pair in alternating blocks (ABBA)\"},\n" + "\"method\":{";
    bool first = true;
    for (int p = 0; p < kNumPairs; ++p) {
        if (!o.pairs[p])
            continue;
        j += std::string(first ? "\n" : ",\n") + "\"" + kPairs[p].ratio + "\":\"" +
             jsonEscape(kPairs[p].method) + "\"";
        first = false;
    }
    j += "},\n\"results\":[";
    for (size_t i = 0; i < samples.size(); ++i) {
        const Sample& s = samples[i];
        j += std::string(i ? ",\n" : "\n") + "{\"transport\":\"" + s.transport +
             "\",\"size\":" + std::to_string(s.size) + ",\"iters\":" + std::to_string(s.iters) +
             ",\"lat_us_p50\":" + num(s.p50_us) + ",\"lat_us_p99\":" + num(s.p99_us) +
             ",\"gbps\":" + num(s.gbps) + ",\"gbps_mean\":" + num(s.gbps_mean) + "}";
    }
    j += "],\n\"ratios\":[";
    std::vector<uint64_t> sizes = sizeList(o);
    for (size_t i = 0; i < sizes.size(); ++i) {
        j += std::string(i ? ",\n" : "\n") + "{\"size\":" + std::to_string(sizes[i]);
        for (int p = 0; p < kNumPairs; ++p) {
            if (o.pairs[p]) {
                j += std::string(",\"") + kPairs[p].ratio +
                     "\":" + ratio(kPairs[p].engine, kPairs[p].baseline, sizes[i]);
            }
        }
        j += "}";
    }
    j += "],\n\"errors\":[";
    for (size_t i = 0; i < errors.size(); ++i) {
        j += std::string(i ? "," : "") + "\"" + jsonEscape(errors[i]) + "\"";
    }
    return j + "]}\n";
}

}  // namespace mooncake::te::bench
