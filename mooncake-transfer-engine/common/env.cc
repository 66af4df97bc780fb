#include "mooncake-transfer-engine/common/env.h"

#include <cstdlib>
#include <cstring>

#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake {

int64_t envInt(const char* name, int64_t default_value) {
    const char* v = std::getenv(name);
    if (!v || !*v) return default_value;
    char* end = nullptr;
    long long parsed = std::strtoll(v, &end, 0);
    if (end == v || *end != '\0') {
        MC_LOG(kWarn, "te") << name << "=" << v << " is not an integer; using " << default_value;
        return default_value;
    }
    return parsed;
}

bool envBool(const char* name, bool default_value) {
    const char* v = std::getenv(name);
    if (!v || !*v) return default_value;
    return std::strcmp(v, "0") != 0 && std::strcmp(v, "false") != 0 && std::strcmp(v, "off") != 0;
}

std::string envString(const char* name, const std::string& default_value) {
    const char* v = std::getenv(name);
    return (v && *v) ? std::string(v) : default_value;
}

}  // namespace mooncake
