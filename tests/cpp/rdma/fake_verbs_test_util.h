// What the tests over the fake verbs library (fake_verbs.cc, built as
// libmc_fake_verbs.so) share: where the library is, which devices it
// emulates, its stall switch and its count of opened devices.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace mooncake::te::fake_verbs_test {

inline constexpr const char* kLibrary = MC_FAKE_VERBS_PATH;

// "name=state/link,..." (e.g. "mlx5_0=active/ib"), read when devices are listed.
inline void fakeDevices(const char* spec) {
    ::setenv("MC_FAKE_VERBS_DEVICES", spec, 1);
}

// While on, the fake's QPs execute nothing (a peer that stopped answering).
inline void stall(bool on) {
    void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(lib, nullptr);
    auto fn = reinterpret_cast<void (*)(int)>(::dlsym(lib, "mc_fake_verbs_stall"));
    ASSERT_NE(fn, nullptr);
    fn(on ? 1 : 0);
}

// How many devices the fake library opened so far (ibv_open_device calls).
inline int devicesOpened() {
    void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr)
        return -1;
    auto fn = reinterpret_cast<int (*)()>(::dlsym(lib, "mc_fake_verbs_devices_opened"));
    return fn ? fn() : -1;
}

}  // namespace mooncake::te::fake_verbs_test
