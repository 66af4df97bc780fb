// Optional hook between a fuzz target and replay_main.cc.
#pragma once

#include <string>
#include <vector>

namespace mooncake::fuzz {

// A fuzz target may define this to hand the replay driver well-formed inputs
// to mutate; random bytes alone rarely get past magic numbers and checksums.
// Declared weak so targets without seeds still link. libFuzzer ignores it.
__attribute__((weak)) std::vector<std::string> seedInputs();

}  // namespace mooncake::fuzz
