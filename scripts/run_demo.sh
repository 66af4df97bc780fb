#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs the 4-rank mooncake-cpu demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
PYTHONPATH=python ${PYTHON:-python3} examples/pg_demo.py --nprocs 4 "$@"
