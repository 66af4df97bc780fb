#!/usr/bin/env bash
# Configures and builds everything (C++ libraries, tests, torch extension
# modules) in ./build and copies the modules into python/mooncake/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export MOONCAKE_BUILD_JOBS=${MOONCAKE_BUILD_JOBS:-$(nproc)}
$PY setup.py -q build_ext --inplace
