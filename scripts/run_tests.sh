#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs every test suite:
# GoogleTest (ctest, with bounded fuzzing) and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# CI builds the rdma transport (install_deps.sh brings its headers): a
# missing header is then a build error, not a silently skipped transport.
export WITH_RDMA=${WITH_RDMA:-ON}
bash scripts/build.sh
# The opt-in NCCL device-API EP transport must keep compiling and linking
# (its runs need 2+ GPUs): its library and the EP module, in build-nccl.
if [ "${WITH_NCCL_DEVICE:-ON}" = "ON" ]; then
    echo "== build: USE_NCCL_DEVICE=ON (build-nccl) =="
    bash scripts/build_nccl_device.sh
fi
PY=${PYTHON:-python3}

echo "== ctest =="
# --no-tests=error: a filter or build that registers nothing is a failure, not a pass.
ctest --test-dir build --output-on-failure --no-tests=error -j 2 --timeout 600

echo "== fuzzing (clang: libFuzzer, ASan, UBSan) =="
bash scripts/run_fuzzers.sh

echo "== pytest =="
# Exit status 5 (nothing collected) fails the run like any other non-zero status.
PYTHONPATH=python $PY -m pytest -q -rs tests/python
