// A check that holds in every build of a fuzz target (NDEBUG or not) and
// makes a failure a crash that libFuzzer and the replay driver both report.
#pragma once

#include <cstdio>
#include <cstdlib>

#define MC_FUZZ_REQUIRE(cond)                                                              \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            std::fprintf(stderr, "fuzz requirement failed: %s (%s:%d)\n", #cond, __FILE__, \
                         __LINE__);                                                        \
            std::abort();                                                                  \
        }                                                                                  \
    } while (0)
