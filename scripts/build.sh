#!/usr/bin/env bash
# Configures and builds everything (C++ libraries, tests, torch extension
# modules) in ./build and copies the modules into python/mooncake/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export MOONCAKE_BUILD_JOBS=${MOONCAKE_BUILD_JOBS:-$(nproc)}
# WITH_NCCL_DEVICE=ON builds the NCCL device-API EP transport into these
# modules (USE_NCCL_DEVICE; the EP module then links libnccl).
if [ "${WITH_NCCL_DEVICE:-}" = "ON" ]; then
    export USE_NCCL_DEVICE=ON
fi
$PY setup.py -q build_ext --inplace
