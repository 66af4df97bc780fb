#!/usr/bin/env bash
# Compiles and links the NCCL device-API EP transport (USE_NCCL_DEVICE=ON) in
# its own build directory (default ./build-nccl), without replacing the
# modules scripts/build.sh put in python/mooncake: CI proves the opt-in
# configuration builds against the NCCL headers found (docs/ep-elastic-buffer.md).
# Only the NCCL library, its host-side tests and the EP module are built, to
# keep CI short; the tests run here too (ctest -R EpNccl).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=${MOONCAKE_NCCL_BUILD_DIR:-build-nccl}
JOBS=${MOONCAKE_BUILD_JOBS:-$(nproc)}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$DIR" "${generator[@]}" -DPython3_EXECUTABLE="$(command -v "$PY")" \
  -DWITH_TORCH=ON -DUSE_CUDA=ON -DWITH_EP=ON -DUSE_NCCL_DEVICE=ON -DBUILD_TESTING=ON \
  -DBUILD_FUZZERS=OFF -DCMAKE_BUILD_TYPE="${MOONCAKE_BUILD_TYPE:-RelWithDebInfo}" \
  ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"}
torch_suffix=$("$PY" -c "import torch; print(torch.__version__.split('+')[0].replace('.', '_'))")
cmake --build "$DIR" -j "$JOBS" --target mooncake_ep_nccl ep_nccl_tests "ep_${torch_suffix}"
ctest --test-dir "$DIR" --output-on-failure --no-tests=error -R '^EpNccl\.' --timeout 120
