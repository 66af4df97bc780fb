// A stand-in for libFuzzer where the compiler has none (gcc): drives any
// LLVMFuzzerTestOneInput with a bounded number of inputs, deterministically.
//
//   <fuzzer> [-runs=N] [-max_len=N] [-seed=N] [-write_seeds=DIR] [FILE_OR_DIR...]
//
// Files (and files in directories) are replayed first: the checked-in corpus
// and crash reproducers. Then N inputs: a quarter random bytes, the rest
// mutations of the target's seedInputs() (see fuzz_seeds.h), of the files, or
// of earlier inputs. -seed=0 draws a seed (printed, to reproduce a failure).
// -write_seeds=DIR writes seedInputs() as files (how tests/fuzz/corpus began)
// and exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_seeds.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

struct Options {
    uint64_t runs = 100000;
    size_t max_len = 4096;
    uint64_t seed = 1;
    std::string write_seeds;
    std::vector<std::string> paths;
};

bool flagValue(const char* arg, const char* name, uint64_t* out) {
    size_t n = std::strlen(name);
    if (std::strncmp(arg, name, n) != 0)
        return false;
    *out = std::strtoull(arg + n, nullptr, 10);
    return true;
}

Options parseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        uint64_t v = 0;
        if (flagValue(argv[i], "-runs=", &v)) {
            o.runs = v;
        } else if (flagValue(argv[i], "-max_len=", &v)) {
            o.max_len = v == 0 ? 1 : v;
        } else if (flagValue(argv[i], "-seed=", &v)) {
            o.seed = v;
        } else if (std::strncmp(argv[i], "-write_seeds=", 13) == 0) {
            o.write_seeds = argv[i] + 13;
        } else if (argv[i][0] == '-') {
            std::fprintf(stderr, "replay: ignoring libFuzzer flag %s\n", argv[i]);
        } else {
            o.paths.push_back(argv[i]);
        }
    }
    return o;
}

void runOne(const std::string& input) {
    // A private copy so the target cannot read past the end unnoticed by
    // sanitizers, just as with libFuzzer.
    std::vector<uint8_t> copy(input.begin(), input.end());
    LLVMFuzzerTestOneInput(copy.data(), copy.size());
}

// Runs every file under `paths`; each becomes a parent for mutations too.
size_t replayPaths(const std::vector<std::string>& paths, std::vector<std::string>* pool) {
    size_t count = 0;
    auto replayFile = [&](const std::filesystem::path& p) {
        std::ifstream in(p, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        runOne(ss.str());
        pool->push_back(ss.str());
        ++count;
    };
    for (const auto& path : paths) {
        if (std::filesystem::is_directory(path)) {
            for (const auto& e : std::filesystem::recursive_directory_iterator(path)) {
                if (e.is_regular_file())
                    replayFile(e.path());
            }
        } else {
            replayFile(path);
        }
    }
    return count;
}

class Mutator {
public:
    Mutator(uint64_t seed, size_t max_len) : rng_(seed), max_len_(max_len) {}

    uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

    std::string randomBytes() {
        std::string s(below(max_len_ + 1), '\0');
        for (auto& c : s)
            c = static_cast<char>(rng_());
        return s;
    }

    // A few stacked edits of `in`, the kinds that break length, offset and
    // checksum handling: bit flips, boundary integers, cuts, inserts, splices.
    std::string mutate(std::string s, const std::string& other) {
        int edits = 1 + static_cast<int>(below(4));
        for (int e = 0; e < edits; ++e) {
            switch (below(8)) {
                case 0:
                    if (!s.empty())
                        s[below(s.size())] ^= static_cast<char>(1u << below(8));
                    break;
                case 1:
                    if (!s.empty())
                        s[below(s.size())] = static_cast<char>(rng_());
                    break;
                case 2: {  // a little-endian boundary value over 1, 2, 4 or 8 bytes
                    static const uint64_t kValues[] = {
                        0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0xffffffff, ~0ull, ~0ull >> 1};
                    size_t width = size_t{1} << below(4);
                    if (s.size() < width)
                        break;
                    size_t at = below(s.size() - width + 1);
                    uint64_t v = kValues[below(std::size(kValues))];
                    if (below(2))
                        v = ~v + below(3);
                    for (size_t i = 0; i < width; ++i)
                        s[at + i] = static_cast<char>(v >> (8 * i));
                    break;
                }
                case 3:
                    s.resize(below(s.size() + 1));
                    break;
                case 4: {
                    std::string ins(1 + below(16), '\0');
                    for (auto& c : ins)
                        c = static_cast<char>(rng_());
                    s.insert(below(s.size() + 1), ins);
                    break;
                }
                case 5:
                    if (!s.empty()) {
                        size_t at = below(s.size());
                        s.erase(at, 1 + below(s.size() - at));
                    }
                    break;
                case 6:
                    if (!other.empty()) {
                        size_t at = below(other.size());
                        s = s.substr(0, below(s.size() + 1)) + other.substr(at);
                    }
                    break;
                default:
                    if (!s.empty()) {  // duplicate a chunk
                        size_t at = below(s.size());
                        s.insert(below(s.size() + 1), s.substr(at, 1 + below(64)));
                    }
                    break;
            }
        }
        if (s.size() > max_len_)
            s.resize(max_len_);
        return s;
    }

private:
    std::mt19937_64 rng_;
    size_t max_len_;
};

int writeSeeds(const std::vector<std::string>& seeds, const std::string& dir) {
    std::filesystem::create_directories(dir);
    for (size_t i = 0; i < seeds.size(); ++i) {
        const auto path = std::filesystem::path(dir) / ("seed-" + std::to_string(i));
        std::ofstream out(path, std::ios::binary);
        out << seeds[i];
        if (!out) {
            std::fprintf(stderr, "replay: cannot write %s\n", path.c_str());
            return 1;
        }
    }
    std::printf("replay: wrote %zu seed(s) to %s\n", seeds.size(), dir.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options o = parseArgs(argc, argv);
    std::vector<std::string> pool;
    if (mooncake::fuzz::seedInputs)
        pool = mooncake::fuzz::seedInputs();
    if (!o.write_seeds.empty())
        return writeSeeds(pool, o.write_seeds);
    for (const auto& s : pool)
        runOne(s);
    size_t replayed = replayPaths(o.paths, &pool);
    const size_t seeds = pool.size();
    if (o.seed == 0)
        o.seed = std::random_device{}() | 1;

    Mutator m(o.seed, o.max_len);
    for (uint64_t i = 0; i < o.runs; ++i) {
        std::string input;
        if (pool.empty() || m.below(4) == 0) {
            input = m.randomBytes();
        } else {
            input = m.mutate(pool[m.below(pool.size())], pool[m.below(pool.size())]);
        }
        runOne(input);
        // Keep some mutants as parents so edits compound, with a bounded pool.
        if (m.below(16) == 0) {
            if (pool.size() < seeds + 256) {
                pool.push_back(std::move(input));
            } else if (pool.size() > seeds) {
                pool[seeds + m.below(pool.size() - seeds)] = std::move(input);
            }
        }
    }
    std::printf("replay: %zu file(s), %zu parent(s), %llu generated inputs (seed %llu): no crash\n",
                replayed, seeds, static_cast<unsigned long long>(o.runs),
                static_cast<unsigned long long>(o.seed));
    return 0;
}
