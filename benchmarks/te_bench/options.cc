#include "benchmarks/te_bench/options.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace mooncake::te::bench {
namespace {

constexpr uint64_t kBytesPerSize = 2ull << 30;  // caps iterations of large sizes
constexpr int kMinIters = 5;

// A decimal count with an optional K/M/G (binary) suffix.
bool parseBytes(const std::string& text, uint64_t* out) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || end == text.c_str() || text[0] == '-')
        return false;
    int shift = 0;
    switch (*end) {
        case 'K':
        case 'k':
            shift = 10;
            break;
        case 'M':
        case 'm':
            shift = 20;
            break;
        case 'G':
        case 'g':
            shift = 30;
            break;
        default:
            break;
    }
    if (shift != 0)
        ++end;
    if (*end != '\0' || v > (UINT64_MAX >> shift))
        return false;
    *out = static_cast<uint64_t>(v) << shift;
    return true;
}

bool parsePairs(const std::string& list, bool* pairs) {
    std::fill(pairs, pairs + kNumPairs, false);
    size_t start = 0;
    while (start <= list.size()) {
        size_t comma = std::min(list.find(',', start), list.size());
        std::string name = list.substr(start, comma - start);
        bool found = false;
        for (int p = 0; p < kNumPairs; ++p) {
            if (name == kPairs[p].name)
                pairs[p] = found = true;
        }
        if (!found)
            return false;
        start = comma + 1;
    }
    return true;
}

}  // namespace

bool parseArgs(int argc, char** argv, Options* o) {
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i], value;
        size_t eq = flag.find('=');
        if (eq != std::string::npos) {
            value = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
        } else if (i + 1 < argc) {
            value = argv[++i];
        }
        uint64_t n = 0;
        bool ok = !value.empty();
        if (flag == "--min-bytes") {
            ok = ok && parseBytes(value, &o->min_bytes) && o->min_bytes > 0;
        } else if (flag == "--max-bytes") {
            ok = ok && parseBytes(value, &o->max_bytes);
        } else if (flag == "--iters" || flag == "--warmup") {
            ok = ok && parseBytes(value, &n) && n <= INT32_MAX;
            (flag == "--iters" ? o->iters : o->warmup) = static_cast<int>(n);
        } else if (flag == "--rounds" || flag == "--depth") {
            ok = ok && parseBytes(value, &n) && n > 0 && n <= 1024;
            (flag == "--rounds" ? o->rounds : o->depth) = static_cast<int>(n);
        } else if (flag == "--cpus") {
            char* end = nullptr;
            o->parent_cpu = static_cast<int>(std::strtol(value.c_str(), &end, 10));
            ok = ok && *end == ',' && o->parent_cpu >= 0;
            if (ok) {
                o->child_cpu = static_cast<int>(std::strtol(end + 1, &end, 10));
                ok = *end == '\0' && o->child_cpu >= 0 && o->parent_cpu < CPU_SETSIZE &&
                     o->child_cpu < CPU_SETSIZE;
            }
        } else if (flag == "--pairs") {
            ok = ok && parsePairs(value, o->pairs);
        } else if (flag == "--congestion") {
            o->congestion = value;
        } else if (flag == "--json-output") {
            o->json_output = value;
        } else {
            ok = false;
        }
        if (!ok) {
            std::fprintf(stderr, "te_bench: bad argument %s '%s'\n", flag.c_str(), value.c_str());
            return false;
        }
    }
    return o->min_bytes <= o->max_bytes && o->iters > 0;
}

std::vector<uint64_t> sizeList(const Options& o) {
    std::vector<uint64_t> sizes;
    for (uint64_t s = o.min_bytes; s <= o.max_bytes; s = s > UINT64_MAX / 4 ? UINT64_MAX : s * 4) {
        sizes.push_back(s);
    }
    if (sizes.back() != o.max_bytes)
        sizes.push_back(o.max_bytes);
    return sizes;
}

namespace {

// Large sizes run fewer iterations so every size moves about kBytesPerSize.
int itersFor(const Options& o, uint64_t size) {
    uint64_t n = std::max<uint64_t>(kMinIters, kBytesPerSize / size);
    return static_cast<int>(std::min<uint64_t>(n, static_cast<uint64_t>(o.iters)));
}
int warmupFor(const Options& o, uint64_t size) {
    uint64_t n = std::max<uint64_t>(1, kBytesPerSize / 8 / size);
    return static_cast<int>(std::min<uint64_t>(n, static_cast<uint64_t>(o.warmup)));
}

}  // namespace

std::vector<Block> schedule(const Options& o) {
    std::vector<Block> blocks;
    for (uint64_t size : sizeList(o)) {
        const int iters = itersFor(o, size);
        const int rounds = std::min(o.rounds, iters);
        const int warmup = std::max(1, (warmupFor(o, size) + rounds - 1) / rounds);
        for (int p = 0; p < kNumPairs; ++p) {
            if (!o.pairs[p])
                continue;
            for (int r = 0; r < rounds; ++r) {
                const int n = iters / rounds + (r < iters % rounds ? 1 : 0);
                const bool engine_first = r % 2 == 1;
                // A stream block is timed only once depth messages are in
                // flight; before that an iteration waits for nothing.
                const int w = kPairs[p].stream ? std::max(warmup, o.depth) : warmup;
                blocks.push_back({size, p, engine_first, w, n});
                blocks.push_back({size, p, !engine_first, w, n});
            }
        }
    }
    return blocks;
}

}  // namespace mooncake::te::bench
