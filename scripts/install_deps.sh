#!/usr/bin/env bash
# Installs what the build and tests need on a fresh Debian/Ubuntu machine.
# Idempotent and quick when everything is already present.
set -euo pipefail

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
command -v ccache >/dev/null || need_apt+=(ccache)
# Only for the test harness: native stacks of a hung worker in its report.
command -v gdb >/dev/null || need_apt+=(gdb)
# Only for the two-namespace test (tests/python/pg/test_two_hosts.py): `ip netns`.
command -v ip >/dev/null || need_apt+=(iproute2)
command -v clang++ >/dev/null || need_apt+=(clang)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
# rdma-core's headers (infiniband/verbs.h, mlx5dv.h): the rdma transport and its
# tests build against them; the library loads libibverbs only at run time.
[ -f /usr/include/infiniband/mlx5dv.h ] || need_apt+=(libibverbs-dev)
if command -v clang++ >/dev/null; then
    # libFuzzer's runtime ships in compiler-rt.
    echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) {return 0;}' \
        > /tmp/mc_fuzz_probe.cc
    clang++ -fsanitize=fuzzer /tmp/mc_fuzz_probe.cc -o /tmp/mc_fuzz_probe 2>/dev/null \
        || need_apt+=(libclang-rt-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "install_deps: apt-get install ${need_apt[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PY=${PYTHON:-python3}
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.11.0" else 1)' \
        2>/dev/null; then
    $PY -m pip install -q torch==2.11.0
fi
# expecttest: imported by torch's own distributed test suite (tests/python/torch_suite).
$PY -c 'import pytest, numpy, expecttest' 2>/dev/null || $PY -m pip install -q pytest numpy expecttest
# ep_benchmark --plot (and its test).
$PY -c 'import matplotlib' 2>/dev/null || $PY -m pip install -q matplotlib
