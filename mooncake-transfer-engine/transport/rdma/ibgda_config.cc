#include "mooncake-transfer-engine/transport/rdma/ibgda_config.h"

#include <cstdlib>
#include <string>

namespace mooncake::te::rdma {

Result<int> parseActiveQpsPerRank(const char* value) {
    if (!value || !*value)
        return kDefaultActiveQpsPerRank;
    // strtol would accept " 8", "+8" and "8abc"; only plain digits are meant.
    long parsed = 0;
    bool ok = true;
    for (const char* c = value; *c; ++c) {
        if (*c < '0' || *c > '9' || parsed > kMaxActiveQpsPerRank) {
            ok = false;
            break;
        }
        parsed = parsed * 10 + (*c - '0');
    }
    if (!ok || parsed < 1 || parsed > kMaxActiveQpsPerRank)
        return InvalidArgument("MOONCAKE_EP_ACTIVE_QPS_PER_RANK='" + std::string(value) +
                               "' is not a QP count; expected an integer in 1.." +
                               std::to_string(kMaxActiveQpsPerRank) + " (default " +
                               std::to_string(kDefaultActiveQpsPerRank) + ")");
    return static_cast<int>(parsed);
}

Result<int> activeQpsPerRankFromEnv() {
    return parseActiveQpsPerRank(std::getenv("MOONCAKE_EP_ACTIVE_QPS_PER_RANK"));
}

}  // namespace mooncake::te::rdma
