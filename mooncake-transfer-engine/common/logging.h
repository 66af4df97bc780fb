// Logging by subsystem with a runtime level and mask.
//   MC_LOG_LEVEL = error | warn | info | debug | trace   (default warn)
//   MC_LOG_SUBSYS = comma list of subsystems to show at levels >= info
//                   (default all): te,tcp,shm,cuda_ipc,rdma,pg,coord,ep
#pragma once

#include <sstream>
#include <string_view>

namespace mooncake {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

bool logEnabled(LogLevel level, std::string_view subsystem);
void logWrite(LogLevel level, std::string_view subsystem, const char* file, int line,
              const std::string& text);

}  // namespace mooncake

#define MC_LOG(level, subsys)                                                              \
    for (bool _mc_on = ::mooncake::logEnabled(::mooncake::LogLevel::level, subsys); _mc_on; \
         _mc_on = false)                                                                    \
    ::mooncake::detail::LogLine(::mooncake::LogLevel::level, subsys, __FILE__, __LINE__).stream()

namespace mooncake::detail {
class LogLine {
public:
    LogLine(LogLevel level, std::string_view subsys, const char* file, int line)
        : level_(level), subsys_(subsys), file_(file), line_(line) {}
    ~LogLine() { logWrite(level_, subsys_, file_, line_, os_.str()); }
    std::ostringstream& stream() { return os_; }

private:
    LogLevel level_;
    std::string_view subsys_;
    const char* file_;
    int line_;
    std::ostringstream os_;
};
}  // namespace mooncake::detail
