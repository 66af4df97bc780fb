// Test support for the Communicator: a ThreadFabricGroup with one
// Communicator per rank, deterministic inputs, and a reference reduction
// computed independently of the core's kernels (in double / wide integers).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/types.h"

namespace mooncake::pg::testutil {

// Small slots so that modest tensors need several rounds and exercise the
// double buffering.
inline CommOptions smallOptions() {
    CommOptions o;
    o.chunk_bytes = 4096;
    o.one_shot_max_bytes = 1024;
    return o;
}

inline Deadline generous() {
    return Deadline::after(std::chrono::seconds(30));
}

// Which peer windows a rank can load from directly (shared memory on one
// host); the protocols must give the same results whatever the answer.
enum class Mapping {
    kAll,   // every window mapped (one host)
    kNone,  // nothing mapped (every peer on another host)
    kSome,  // rank r maps only lower ranks' windows: asymmetric and partial
};

inline const char* mappingName(Mapping m) {
    switch (m) {
        case Mapping::kAll:
            return "mapped";
        case Mapping::kNone:
            return "unmapped";
        case Mapping::kSome:
            return "partly_mapped";
    }
    return "?";
}

// Forwards everything to another fabric; tests override what they change.
class ForwardingFabric : public Fabric {
public:
    explicit ForwardingFabric(std::shared_ptr<Fabric> inner) : inner_(std::move(inner)) {}
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    size_t windowBytes() const override { return inner_->windowBytes(); }
    uint8_t* localWindow() override { return inner_->localWindow(); }
    Status put(int peer, uint64_t offset, const void* src, size_t len, Deadline deadline) override {
        return inner_->put(peer, offset, src, len, deadline);
    }
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override {
        return inner_->putFlag(peer, offset, value, deadline);
    }
    uint8_t* peerWindow(int peer) override { return inner_->peerWindow(peer); }
    bool peerFailed(int peer) const override { return inner_->peerFailed(peer); }
    bool flush(Deadline deadline) override { return inner_->flush(deadline); }

protected:
    Fabric& inner() { return *inner_; }

private:
    std::shared_ptr<Fabric> inner_;
};

// A ThreadFabric that hides some peers' windows.
class MappingFabric : public ForwardingFabric {
public:
    MappingFabric(std::shared_ptr<Fabric> inner, Mapping mapping)
        : ForwardingFabric(std::move(inner)), mapping_(mapping) {}
    uint8_t* peerWindow(int peer) override {
        const bool mapped =
            mapping_ == Mapping::kAll || (mapping_ == Mapping::kSome && peer < rank());
        return mapped ? inner().peerWindow(peer) : nullptr;
    }

private:
    Mapping mapping_;
};

// For tests of who is blamed at a deadline: the listed ranks may not time
// out before each has written to every other one. waitFlag asks peerFailed
// before it looks at the deadline, so a listed rank blocked there stays in
// its wait until every other listed rank's first message (its round-0
// message, sent before it waits on anyone) is in its window. However late a
// thread runs, the only members missing at the deadline are the unlisted.
class EntryGate {
public:
    explicit EntryGate(std::vector<int> ranks) : ranks_(std::move(ranks)) {}

    // Forgets earlier writes: the next call is the one gated.
    void arm() {
        std::lock_guard<std::mutex> lock(mu_);
        written_.clear();
    }

    void wrote(int from, int to) {
        std::lock_guard<std::mutex> lock(mu_);
        written_.emplace(from, to);
        cv_.notify_all();
    }
    void awaitAllWroteTo(int to) {
        if (std::find(ranks_.begin(), ranks_.end(), to) == ranks_.end())
            return;
        std::unique_lock<std::mutex> lock(mu_);
        auto all = [&] {
            for (int from : ranks_) {
                if (from != to && written_.count({from, to}) == 0)
                    return false;
            }
            return true;
        };
        if (!cv_.wait_for(lock, std::chrono::seconds(20), all))
            ADD_FAILURE() << "rank " << to << ": a listed rank never wrote to it";
    }

private:
    std::vector<int> ranks_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::set<std::pair<int, int>> written_;
};

class EntryGatedFabric : public ForwardingFabric {
public:
    EntryGatedFabric(std::shared_ptr<Fabric> inner, std::shared_ptr<EntryGate> gate)
        : ForwardingFabric(std::move(inner)), gate_(std::move(gate)) {}
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override {
        Status st = inner().putFlag(peer, offset, value, deadline);
        gate_->wrote(rank(), peer);
        return st;
    }
    bool peerFailed(int peer) const override {
        gate_->awaitAllWroteTo(rank());
        return ForwardingFabric::peerFailed(peer);
    }

private:
    std::shared_ptr<EntryGate> gate_;
};

class Cluster {
public:
    // `gate`, when given, wraps every rank's fabric (see EntryGate).
    explicit Cluster(int n, CommOptions options = smallOptions(), Mapping mapping = Mapping::kAll,
                     std::shared_ptr<EntryGate> gate = nullptr)
        : n_(n), group_(n, Communicator::windowBytesFor(n, options)) {
        for (int r = 0; r < n; ++r) {
            std::shared_ptr<Fabric> fabric =
                std::make_shared<MappingFabric>(group_.fabric(r), mapping);
            if (gate)
                fabric = std::make_shared<EntryGatedFabric>(fabric, gate);
            comms_.push_back(std::make_unique<Communicator>(fabric, options));
        }
    }
    int size() const { return n_; }
    Communicator& comm(int r) { return *comms_[r]; }
    ThreadFabricGroup& group() { return group_; }

    // Runs body(rank) on one thread per listed rank (all ranks by default).
    void run(const std::function<void(int)>& body, std::vector<int> ranks = {}) {
        if (ranks.empty()) {
            for (int r = 0; r < n_; ++r)
                ranks.push_back(r);
        }
        std::vector<std::thread> threads;
        for (int r : ranks)
            threads.emplace_back(body, r);
        for (auto& t : threads)
            t.join();
    }

private:
    int n_;
    ThreadFabricGroup group_;
    std::vector<std::unique_ptr<Communicator>> comms_;
};

inline uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline uint64_t rnd(uint64_t seed, int rank, size_t i) {
    return mix(seed * 0x100000001B3ull ^ (static_cast<uint64_t>(rank) << 48) ^ i);
}

// Byte i of rank `rank`'s data for a byte-oriented call.
inline uint8_t patternByte(uint64_t seed, int rank, size_t i) {
    return static_cast<uint8_t>(rnd(seed, rank, i) >> 17);
}

inline void fillPattern(uint8_t* dst, size_t n, uint64_t seed, int rank) {
    for (size_t i = 0; i < n; ++i)
        dst[i] = patternByte(seed, rank, i);
}

// Index of the first byte that differs from the pattern, or -1.
inline long firstPatternMismatch(const uint8_t* got, size_t n, uint64_t seed, int rank) {
    for (size_t i = 0; i < n; ++i) {
        if (got[i] != patternByte(seed, rank, i))
            return static_cast<long>(i);
    }
    return -1;
}

// ---- element values -------------------------------------------------------
// Float inputs are quarters (k / 4), exactly representable in every float
// dtype, so the encoders below only need to handle exact values.

inline uint16_t exactHalfBits(double v) {
    if (v == 0)
        return std::signbit(v) ? 0x8000 : 0;
    const uint16_t sign = v < 0 ? 0x8000 : 0;
    int e = 0;
    const double m = std::frexp(std::fabs(v), &e);  // v = m * 2^e, m in [0.5, 1)
    const int exponent = e - 1 + 15;
    const auto mantissa = static_cast<uint16_t>(std::ldexp(m * 2 - 1, 10));
    return sign | static_cast<uint16_t>(exponent << 10) | mantissa;
}

inline double halfBitsValue(uint16_t h) {
    const int exponent = (h >> 10) & 0x1F;
    const int mantissa = h & 0x3FF;
    double v;
    if (exponent == 0) {
        v = std::ldexp(mantissa, -24);
    } else if (exponent == 31) {
        v = mantissa != 0 ? NAN : INFINITY;
    } else {
        v = std::ldexp(1024 + mantissa, exponent - 25);
    }
    return (h & 0x8000) != 0 ? -v : v;
}

inline uint16_t exactBf16Bits(double v) {
    const float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return static_cast<uint16_t>(bits >> 16);
}

inline double bf16BitsValue(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// The raw little-endian bits of element i of rank `rank`'s input.
inline uint64_t inputBits(DataType t, ReduceOp op, uint64_t seed, int rank, size_t i) {
    const uint64_t r = rnd(seed, rank, i);
    if (isFloatingPoint(t)) {
        // Products stay in [0.5, 1.5] in magnitude so chains do not blow up.
        const int k = op == ReduceOp::kProduct
                          ? static_cast<int>(2 + r % 5) * ((r >> 8) & 1 ? -1 : 1)
                          : static_cast<int>(r % 65) - 32;
        const double v = k / 4.0;
        switch (t) {
            case DataType::kFloat32: {
                const float f = static_cast<float>(v);
                uint32_t b;
                std::memcpy(&b, &f, 4);
                return b;
            }
            case DataType::kFloat64: {
                uint64_t b;
                std::memcpy(&b, &v, 8);
                return b;
            }
            case DataType::kFloat16:
                return exactHalfBits(v);
            default:
                return exactBf16Bits(v);
        }
    }
    if (t == DataType::kBool)
        return (r >> 5) & 1;
    return r;  // truncated to the element width by the writer
}

inline void writeElement(uint8_t* dst, size_t es, uint64_t bits) {
    for (size_t b = 0; b < es; ++b)
        dst[b] = static_cast<uint8_t>(bits >> (8 * b));
}

inline uint64_t readElement(const uint8_t* src, size_t es) {
    uint64_t bits = 0;
    for (size_t b = 0; b < es; ++b)
        bits |= static_cast<uint64_t>(src[b]) << (8 * b);
    return bits;
}

// Fills count elements starting at global element index `first`.
inline void fillInput(uint8_t* dst, DataType t, ReduceOp op, uint64_t seed, int rank, size_t first,
                      size_t count) {
    const size_t es = dataTypeSize(t);
    for (size_t i = 0; i < count; ++i) {
        writeElement(dst + i * es, es, inputBits(t, op, seed, rank, first + i));
    }
}

inline double floatValue(DataType t, uint64_t bits) {
    switch (t) {
        case DataType::kFloat32: {
            const auto b = static_cast<uint32_t>(bits);
            float f;
            std::memcpy(&f, &b, 4);
            return f;
        }
        case DataType::kFloat64: {
            double d;
            std::memcpy(&d, &bits, 8);
            return d;
        }
        case DataType::kFloat16:
            return halfBitsValue(static_cast<uint16_t>(bits));
        default:
            return bf16BitsValue(static_cast<uint16_t>(bits));
    }
}

// Integer value of `bits`, sign-extended for signed dtypes.
inline int64_t intValue(DataType t, uint64_t bits) {
    switch (t) {
        case DataType::kInt8:
            return static_cast<int8_t>(bits);
        case DataType::kInt16:
            return static_cast<int16_t>(bits);
        case DataType::kInt32:
            return static_cast<int32_t>(bits);
        case DataType::kInt64:
            return static_cast<int64_t>(bits);
        case DataType::kUInt8:
            return static_cast<uint8_t>(bits);
        default:
            return static_cast<int64_t>(bits & 1);
    }
}

// Significand bits (the implicit one included) of each float dtype.
inline int significandBits(DataType t) {
    switch (t) {
        case DataType::kFloat32:
            return 24;
        case DataType::kFloat64:
            return 53;
        case DataType::kFloat16:
            return 11;
        default:
            return 8;
    }
}

// How far a float reduction of `members` inputs may be from the exact value
// `want` (computed in double, exact for these inputs). Sums of quarters k / 4
// with |k| <= 32 stay exact in a dtype of p significand bits while
// members * 32 <= 2^p: every partial sum in any order is then a
// representable quarter, so sum, min and max must match exactly (bf16 up to
// 8 members, fp16 up to 64). Avg adds one division, rounded once: one unit
// in the last place. Products of [0.5, 1.5] round at every step: a relative
// 2^-p per factor.
inline double floatSlack(DataType t, ReduceOp op, size_t members, double want) {
    const int p = significandBits(t);
    const auto ulp = [&](double v) {
        return v == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(v) - p + 1);
    };
    const bool sums_exact = static_cast<double>(members) * 32 <= std::ldexp(1.0, p);
    switch (op) {
        case ReduceOp::kMin:
        case ReduceOp::kMax:
            return 0;
        case ReduceOp::kSum:
            return sums_exact ? 0 : static_cast<double>(members) * ulp(want);
        case ReduceOp::kAvg:
            return sums_exact ? ulp(want) : static_cast<double>(members + 1) * ulp(want);
        default:
            return static_cast<double>(members) * std::ldexp(std::fabs(want), -p);
    }
}

// Checks got[0..count) (global element indices first..) against the
// reduction of `members`' inputs. Returns "" or a description.
inline std::string checkReduction(DataType t, ReduceOp op, const std::vector<int>& members,
                                  uint64_t seed, size_t first, const uint8_t* got, size_t count) {
    const size_t es = dataTypeSize(t);
    const uint64_t mask = es == 8 ? ~uint64_t{0} : ((uint64_t{1} << (8 * es)) - 1);
    for (size_t i = 0; i < count; ++i) {
        const uint64_t got_bits = readElement(got + i * es, es);
        std::vector<uint64_t> in;
        for (int m : members)
            in.push_back(inputBits(t, op, seed, m, first + i) & mask);
        if (isFloatingPoint(t)) {
            double acc = floatValue(t, in[0]);
            for (size_t k = 1; k < in.size(); ++k) {
                const double v = floatValue(t, in[k]);
                switch (op) {
                    case ReduceOp::kSum:
                    case ReduceOp::kAvg:
                        acc += v;
                        break;
                    case ReduceOp::kProduct:
                        acc *= v;
                        break;
                    case ReduceOp::kMin:
                        acc = std::min(acc, v);
                        break;
                    case ReduceOp::kMax:
                        acc = std::max(acc, v);
                        break;
                    default:
                        return "bad op";
                }
            }
            if (op == ReduceOp::kAvg)
                acc /= static_cast<double>(members.size());
            const double g = floatValue(t, got_bits);
            const double slack = floatSlack(t, op, in.size(), acc);
            if (!(std::fabs(g - acc) <= slack)) {
                return "element " + std::to_string(first + i) + ": got " + std::to_string(g) +
                       ", want " + std::to_string(acc) + " (allowed error " +
                       std::to_string(slack) + ")";
            }
            continue;
        }
        uint64_t want;
        if (t == DataType::kBool) {
            bool acc = in[0] != 0;
            for (size_t k = 1; k < in.size(); ++k) {
                const bool v = in[k] != 0;
                switch (op) {
                    case ReduceOp::kSum:
                    case ReduceOp::kMax:
                    case ReduceOp::kBor:
                        acc = acc || v;
                        break;
                    case ReduceOp::kProduct:
                    case ReduceOp::kMin:
                    case ReduceOp::kBand:
                        acc = acc && v;
                        break;
                    case ReduceOp::kBxor:
                        acc = acc != v;
                        break;
                    default:
                        return "bad op";
                }
            }
            want = acc ? 1 : 0;
        } else {
            int64_t acc = intValue(t, in[0]);
            for (size_t k = 1; k < in.size(); ++k) {
                const int64_t v = intValue(t, in[k]);
                const auto ua = static_cast<uint64_t>(acc);
                const auto uv = static_cast<uint64_t>(v);
                switch (op) {
                    case ReduceOp::kSum:
                        acc = static_cast<int64_t>(ua + uv);
                        break;
                    case ReduceOp::kProduct:
                        acc = static_cast<int64_t>(ua * uv);
                        break;
                    case ReduceOp::kMin:
                        acc = std::min(acc, v);
                        break;
                    case ReduceOp::kMax:
                        acc = std::max(acc, v);
                        break;
                    case ReduceOp::kBand:
                        acc = static_cast<int64_t>(ua & uv);
                        break;
                    case ReduceOp::kBor:
                        acc = static_cast<int64_t>(ua | uv);
                        break;
                    case ReduceOp::kBxor:
                        acc = static_cast<int64_t>(ua ^ uv);
                        break;
                    default:
                        return "bad op";
                }
                // Narrow types wrap at their own width after every step.
                acc = intValue(t, static_cast<uint64_t>(acc) & mask);
            }
            want = static_cast<uint64_t>(acc) & mask;
        }
        if ((got_bits & mask) != want) {
            return "element " + std::to_string(first + i) + ": got " + std::to_string(got_bits) +
                   ", want " + std::to_string(want);
        }
    }
    return "";
}

// The documented support matrix (docs/pg-user-guide.md, "Supported
// operations"), written out rather than asked of reduceOpSupported, so a
// pair the product stops supporting fails the suites instead of dropping out
// of them. One column per ReduceOp in enum order: sum, avg, product, min,
// max, band, bor, bxor; '-' where the pair must be rejected.
struct SupportRow {
    DataType dtype;
    const char* ops;
};
inline constexpr SupportRow kSupportTable[] = {
    {DataType::kFloat32, "SAPmM---"}, {DataType::kFloat64, "SAPmM---"},
    {DataType::kFloat16, "SAPmM---"}, {DataType::kBFloat16, "SAPmM---"},
    {DataType::kInt8, "S-PmM&|^"},    {DataType::kUInt8, "S-PmM&|^"},
    {DataType::kInt16, "S-PmM&|^"},   {DataType::kInt32, "S-PmM&|^"},
    {DataType::kInt64, "S-PmM&|^"},   {DataType::kBool, "S-PmM&|^"},
};
inline constexpr int kNumReduceOps = 8;

// Every (dtype, op) pair the table supports.
inline std::vector<std::pair<DataType, ReduceOp>> supportedPairs() {
    std::vector<std::pair<DataType, ReduceOp>> out;
    for (const SupportRow& row : kSupportTable) {
        for (int o = 0; o < kNumReduceOps; ++o) {
            if (row.ops[o] != '-')
                out.emplace_back(row.dtype, static_cast<ReduceOp>(o));
        }
    }
    return out;
}

inline std::vector<int> allRanks(int n) {
    std::vector<int> v;
    for (int r = 0; r < n; ++r)
        v.push_back(r);
    return v;
}

}  // namespace mooncake::pg::testutil
