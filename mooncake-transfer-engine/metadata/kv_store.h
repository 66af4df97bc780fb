// The key-value store through which segments publish their metadata.
// The PG layer adapts the c10d Store torch hands the backend to this
// interface; tests use InProcessKVStore (threads) or FileKVStore (processes).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake {

class KVStore {
public:
    virtual ~KVStore() = default;
    virtual Status set(const std::string& key, const std::string& value) = 0;
    // Blocks until `key` exists or the deadline passes (kTimeout).
    virtual Result<std::string> get(const std::string& key, Deadline deadline) = 0;
    // Atomically adds `delta` to the integer stored at `key` (0 when absent).
    virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
    virtual Status remove(const std::string& key) = 0;
};

// Threads of one process.
class InProcessKVStore : public KVStore {
public:
    Status set(const std::string& key, const std::string& value) override;
    Result<std::string> get(const std::string& key, Deadline deadline) override;
    Result<int64_t> add(const std::string& key, int64_t delta) override;
    Status remove(const std::string& key) override;

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, std::string> values_;
};

// Processes of one host sharing a directory. Writes are atomic renames; get()
// polls with a growing back-off bounded by the deadline.
class FileKVStore : public KVStore {
public:
    explicit FileKVStore(std::string directory);
    Status set(const std::string& key, const std::string& value) override;
    Result<std::string> get(const std::string& key, Deadline deadline) override;
    Result<int64_t> add(const std::string& key, int64_t delta) override;
    Status remove(const std::string& key) override;

private:
    std::string pathFor(const std::string& key) const;
    std::string dir_;
};

}  // namespace mooncake
