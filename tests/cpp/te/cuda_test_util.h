// For tests of device memory between forked processes: whether a fresh
// process can use the GPU, asked in a child so the test process itself never
// touches CUDA (a CUDA context does not survive fork).
#pragma once

#include <unistd.h>

#include <string>

#include "mooncake-transfer-engine/transport/cuda_ipc/device_memory.h"
#include "tests/cpp/te/transport_test_util.h"

namespace mooncake::te::test {

// "" when a child process could use device memory, else the reason.
inline std::string gpuUnusableReason() {
    int fds[2];
    if (::pipe(fds) != 0)
        return "pipe failed";
    Child probe([&] {
        ::close(fds[0]);
        Status st = deviceMemoryAvailable();
        std::string why = st.ok() ? "" : st.toString();
        if (!why.empty())
            (void)!::write(fds[1], why.data(), why.size());
        ::close(fds[1]);
        return 0;
    });
    ::close(fds[1]);
    std::string why;
    char buf[256];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0)
        why.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    if (probe.wait(Deadline::afterMs(30000)) != 0)
        return "the CUDA probe process failed";
    return why;
}

}  // namespace mooncake::te::test

// Skips the calling test, with the reason, where no GPU is usable.
#define SKIP_WITHOUT_GPU()                                            \
    do {                                                              \
        std::string _why = ::mooncake::te::test::gpuUnusableReason(); \
        if (!_why.empty())                                            \
            GTEST_SKIP() << "no usable CUDA device: " << _why;        \
    } while (0)
