// Environment knobs, declared next to the code they control:
//   MC_ENV_INT(TcpConnectTimeoutMs, "MC_TCP_CONNECT_TIMEOUT_MS", 10000)
// defines `int64_t envTcpConnectTimeoutMs()` that reads the variable once.
#pragma once

#include <cstdint>
#include <string>

namespace mooncake {

int64_t envInt(const char* name, int64_t default_value);
bool envBool(const char* name, bool default_value);
std::string envString(const char* name, const std::string& default_value);

}  // namespace mooncake

#define MC_ENV_INT(fn, var, dflt)                                     \
    static int64_t env##fn() {                                        \
        static const int64_t value = ::mooncake::envInt(var, (dflt)); \
        return value;                                                 \
    }
#define MC_ENV_BOOL(fn, var, dflt)                                 \
    static bool env##fn() {                                        \
        static const bool value = ::mooncake::envBool(var, (dflt)); \
        return value;                                              \
    }
