#include "mooncake-transfer-engine/common/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace mooncake {
namespace {

struct LogConfig {
    LogLevel level = LogLevel::kWarn;
    bool all_subsystems = true;
    std::set<std::string, std::less<>> subsystems;

    LogConfig() {
        if (const char* lv = std::getenv("MC_LOG_LEVEL")) {
            std::string s(lv);
            if (s == "error") level = LogLevel::kError;
            else if (s == "warn") level = LogLevel::kWarn;
            else if (s == "info") level = LogLevel::kInfo;
            else if (s == "debug") level = LogLevel::kDebug;
            else if (s == "trace") level = LogLevel::kTrace;
        }
        if (const char* mask = std::getenv("MC_LOG_SUBSYS")) {
            all_subsystems = false;
            std::string s(mask);
            size_t pos = 0;
            while (pos <= s.size()) {
                size_t comma = s.find(',', pos);
                if (comma == std::string::npos) comma = s.size();
                if (comma > pos) subsystems.insert(s.substr(pos, comma - pos));
                pos = comma + 1;
            }
        }
    }
};

const LogConfig& config() {
    static const LogConfig cfg;
    return cfg;
}

const char* levelName(LogLevel level) {
    switch (level) {
        case LogLevel::kError: return "E";
        case LogLevel::kWarn: return "W";
        case LogLevel::kInfo: return "I";
        case LogLevel::kDebug: return "D";
        case LogLevel::kTrace: return "T";
    }
    return "?";
}

}  // namespace

bool logEnabled(LogLevel level, std::string_view subsystem) {
    const LogConfig& cfg = config();
    if (level > cfg.level) return false;
    // Errors and warnings always pass the subsystem mask.
    if (level <= LogLevel::kWarn || cfg.all_subsystems) return true;
    return cfg.subsystems.find(subsystem) != cfg.subsystems.end();
}

void logWrite(LogLevel level, std::string_view subsystem, const char* file, int line,
              const std::string& text) {
    static std::mutex mu;
    const char* base = std::strrchr(file, '/');
    base = base ? base + 1 : file;
    auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
    std::lock_guard<std::mutex> lock(mu);
    std::fprintf(stderr, "[mooncake %s %lld.%06lld pid %d %.*s %s:%d] %s\n", levelName(level),
                 static_cast<long long>(now / 1000000), static_cast<long long>(now % 1000000),
                 static_cast<int>(getpid()), static_cast<int>(subsystem.size()),
                 subsystem.data(), base, line, text.c_str());
}

}  // namespace mooncake
