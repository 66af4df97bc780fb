// The dispatch handle's layout_range entries, DeepEP's convention: for local
// expert le and source rank r, layout_range[le][r] = begin << 32 | count,
// where packed rows [begin, begin + count) of expert le came from rank r (in
// that rank's token order) and src_info[le][row] is the token's index there.
#pragma once

#include <cstdint>

#include "mooncake-ep/core/host_device.h"

namespace mooncake::ep {

MC_EP_HD constexpr int64_t epEncodeRange(int64_t begin, int64_t count) {
    return static_cast<int64_t>((static_cast<uint64_t>(begin) << 32) |
                                static_cast<uint32_t>(count));
}
MC_EP_HD constexpr int64_t epRangeBegin(int64_t range) {
    return static_cast<int64_t>(static_cast<uint64_t>(range) >> 32);
}
MC_EP_HD constexpr int64_t epRangeCount(int64_t range) {
    return static_cast<int64_t>(static_cast<uint32_t>(range));
}

}  // namespace mooncake::ep
