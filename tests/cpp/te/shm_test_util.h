// Helpers shared by the shm transport tests: engines, patterns and checks
// for forked children that report through their exit code (the children
// and temp stores themselves come from transport_test_util.h).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "tests/cpp/te/transport_test_util.h"

namespace mooncake::te::shm_test {

inline constexpr const char* kSecret = "shm-test-secret";
inline constexpr int64_t kWaitMs = 30000;  // generous: only hit when something is broken

using test::Child;
using test::TempDir;

inline std::unique_ptr<TransferEngine> startEngine(std::shared_ptr<KVStore> store,
                                                   const std::string& name,
                                                   const std::string& secret = kSecret,
                                                   bool force_tcp = false) {
    EngineOptions o;
    o.store = std::move(store);
    o.segment_name = name;
    o.secret = secret;
    o.force_tcp = force_tcp;
    o.open_timeout_ms = kWaitMs;
    auto e = std::make_unique<TransferEngine>(o);
    Status st = e->init("127.0.0.1", {});
    if (!st.ok()) {
        std::fprintf(stderr, "engine %s: %s\n", name.c_str(), st.toString().c_str());
        return nullptr;
    }
    return e;
}

inline Status transfer(TransferEngine& e, TransferOpcode op, void* src, SegmentID id, uint64_t addr,
                       uint64_t len) {
    MC_ASSIGN_OR_RETURN(BatchID b, e.allocateBatchID(1));
    TransferRequest r{op, src, id, addr, len};
    Status st = e.submitTransfer(b, {r});
    if (st.ok())
        st = e.waitBatch(b, Deadline::afterMs(kWaitMs));
    (void)e.freeBatchID(b);
    return st;
}

// Deterministic bytes that differ per seed and per position.
inline void fillPattern(char* p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::memcpy(p + i, &x, 8);
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(p + i, &x, n - i);  // the last partial word
}

inline bool allBytes(const char* p, size_t n, char v) {
    for (size_t i = 0; i < n; ++i) {
        if (p[i] != v)
            return false;
    }
    return true;
}

// Page-aligned heap memory (plain, not shareable).
struct Buffer {
    explicit Buffer(size_t n)
        : size(n), data(static_cast<char*>(std::aligned_alloc(4096, round(n)))) {
        std::memset(data, 0, n);
    }
    ~Buffer() { std::free(data); }
    static size_t round(size_t n) { return (n + 4095) / 4096 * 4096; }
    size_t size;
    char* data;
};

// Checks inside a child, where gtest assertions would not reach the parent.
#define CHILD_CHECK(cond)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            std::fprintf(stderr, "child check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)
#define CHILD_OK(expr)                                                       \
    do {                                                                     \
        ::mooncake::Status _st = (expr);                                     \
        if (!_st.ok()) {                                                     \
            std::fprintf(stderr, "child at %s:%d: %s\n", __FILE__, __LINE__, \
                         _st.toString().c_str());                            \
            return 1;                                                        \
        }                                                                    \
    } while (0)

inline std::string waitKey(KVStore& store, const std::string& key) {
    auto v = store.get(key, Deadline::afterMs(kWaitMs));
    return v.ok() ? v.value() : std::string();
}

inline uint64_t waitAddr(KVStore& store, const std::string& key) {
    std::string v = waitKey(store, key);
    return v.empty() ? 0 : std::stoull(v);
}

}  // namespace mooncake::te::shm_test
