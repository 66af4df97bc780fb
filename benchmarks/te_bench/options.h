// te_bench's options, the pairs it measures, and the schedule of blocks that
// the parent and the child both derive from them.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

namespace mooncake::te::bench {

struct PairSpec {
    const char* name;      // --pairs name
    const char* baseline;  // transport names in the results
    const char* engine;
    const char* ratio;  // key in the ratios table
    bool stream;
    bool raw;  // the baseline is the raw socket (the child must mirror it)
    const char* method;
};

inline constexpr PairSpec kPairs[] = {
    {"shm", "memcpy", "shm", "shm_vs_memcpy", false, false,
     "one WRITE at a time (submitTransfer + waitBatch) into the peer's shared allocation vs one "
     "single-process memcpy of the same size"},
    {"tcp", "raw_tcp", "tcp", "tcp_vs_raw_socket", false, true,
     "one WRITE at a time: submitTransfer + waitBatch (returns once the target's COMPLETION "
     "is back) vs a blocking loopback socket between the same two processes that sends the "
     "message and waits for a 1-byte ack the receiver sends after reading all of it"},
    {"tcp_stream", "raw_tcp_stream", "tcp_stream", "tcp_stream_vs_raw_stream", true, true,
     "depth WRITEs in flight, each in its own batch, the next submitted when the oldest "
     "completed vs depth messages in flight on the raw socket, the next sent when the oldest "
     "was acked; timed from a full pipeline, the last in-flight messages drain untimed; "
     "iteration time = mean interval between completions over one block, p50/p99 over the "
     "blocks"},
};
inline constexpr int kNumPairs = static_cast<int>(std::size(kPairs));

struct Options {
    uint64_t min_bytes = 64;
    uint64_t max_bytes = 256ull << 20;
    int iters = 1000;
    int warmup = 50;
    int rounds = 6;
    int depth = 4;
    bool pairs[kNumPairs] = {true, true, true};
    int parent_cpu = -1, child_cpu = -1;
    std::string congestion;  // empty: the system's
    std::string json_output;

    bool any(bool raw) const {
        for (int p = 0; p < kNumPairs; ++p) {
            if (pairs[p] && kPairs[p].raw == raw)
                return true;
        }
        return false;
    }
    bool enabled(const char* name) const {
        for (int p = 0; p < kNumPairs; ++p) {
            if (pairs[p] && std::strcmp(kPairs[p].name, name) == 0)
                return true;
        }
        return false;
    }
};

// One block: `warmup` untimed then `iters` timed iterations of one side of a pair.
struct Block {
    uint64_t size = 0;
    int pair = 0;
    bool engine = false;
    int warmup = 0;
    int iters = 0;
};

// Parses the flags into `o`; false on a bad argument (named on stderr) or
// settings that contradict each other.
bool parseArgs(int argc, char** argv, Options* o);

// Powers of 4 from min_bytes, plus max_bytes itself.
std::vector<uint64_t> sizeList(const Options& o);

// Sizes in order; per size every enabled pair in `rounds` rounds, the two
// sides in ABBA order. Parent and child derive the same list.
std::vector<Block> schedule(const Options& o);

}  // namespace mooncake::te::bench
