#include "mooncake-transfer-engine/metadata/kv_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/common/random.h"

namespace mooncake {

Status InProcessKVStore::set(const std::string& key, const std::string& value) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        values_[key] = value;
    }
    cv_.notify_all();
    return Status::OK();
}

Result<std::string> InProcessKVStore::get(const std::string& key, Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    bool found = cv_.wait_until(lock, deadline.at(), [&] { return values_.count(key) > 0; });
    if (!found) return Timeout("key '" + key + "' was not published before the deadline");
    return values_[key];
}

Result<int64_t> InProcessKVStore::add(const std::string& key, int64_t delta) {
    int64_t result;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = values_.find(key);
        int64_t current = it == values_.end() ? 0 : std::stoll(it->second);
        result = current + delta;
        values_[key] = std::to_string(result);
    }
    cv_.notify_all();
    return result;
}

Status InProcessKVStore::remove(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    values_.erase(key);
    return Status::OK();
}

FileKVStore::FileKVStore(std::string directory) : dir_(std::move(directory)) {
    ::mkdir(dir_.c_str(), 0700);
}

std::string FileKVStore::pathFor(const std::string& key) const {
    // Keys may hold '/' and ':'; map every byte outside [A-Za-z0-9_.-] to %XX.
    std::string name;
    static const char* kHex = "0123456789ABCDEF";
    for (unsigned char c : key) {
        if (std::isalnum(c) || c == '_' || c == '.' || c == '-') {
            name.push_back(static_cast<char>(c));
        } else {
            name.push_back('%');
            name.push_back(kHex[c >> 4]);
            name.push_back(kHex[c & 15]);
        }
    }
    return dir_ + "/" + name;
}

Status FileKVStore::set(const std::string& key, const std::string& value) {
    std::string path = pathFor(key);
    std::string tmp = path + ".tmp." + randomHex(6);
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) return Internal("cannot write " + tmp + ": " + std::strerror(errno));
        out.write(value.data(), static_cast<std::streamsize>(value.size()));
        if (!out) return Internal("short write to " + tmp);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        return Internal("rename " + tmp + ": " + std::strerror(errno));
    }
    return Status::OK();
}

Result<std::string> FileKVStore::get(const std::string& key, Deadline deadline) {
    std::string path = pathFor(key);
    auto backoff = std::chrono::microseconds(50);
    while (true) {
        std::ifstream in(path, std::ios::binary);
        if (in) {
            std::stringstream ss;
            ss << in.rdbuf();
            return ss.str();
        }
        if (deadline.expired()) {
            return Timeout("key '" + key + "' was not published before the deadline");
        }
        std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(backoff, deadline.remaining()));
        backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
    }
}

Result<int64_t> FileKVStore::add(const std::string& key, int64_t delta) {
    std::string lock_path = dir_ + "/.lock";
    int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) return Internal("open " + lock_path + ": " + std::strerror(errno));
    ::flock(fd, LOCK_EX);
    int64_t current = 0;
    {
        std::ifstream in(pathFor(key));
        if (in) in >> current;
    }
    int64_t result = current + delta;
    Status st = set(key, std::to_string(result));
    ::flock(fd, LOCK_UN);
    ::close(fd);
    if (!st.ok()) return st;
    return result;
}

Status FileKVStore::remove(const std::string& key) {
    ::unlink(pathFor(key).c_str());
    return Status::OK();
}

}  // namespace mooncake
