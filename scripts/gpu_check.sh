#!/usr/bin/env bash
# The whole GPU run, in one call on the GPU machine (see docs/gpu-testing.md):
# builds for sm_90 with -j16 in ./build-gpu, starts MPS, runs the GPU tests
# (GoogleTest, then pytest where given) and the benchmarks named in
# $MC_GPU_BENCH, and writes every log under LOG_DIR.
#
#   bash scripts/gpu_check.sh LOG_DIR [CTEST_REGEX] [PYTEST_ARGS...]
#
# CTEST_REGEX defaults to every test; "-" skips ctest. PYTEST_ARGS, when
# given, run with PYTHONPATH=python after ctest. MC_GPU_TARGETS="a b" builds
# only those CMake targets (a shorter call; match CTEST_REGEX to them).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${1:?usage: gpu_check.sh LOG_DIR [CTEST_REGEX] [PYTEST_ARGS...]}
CTEST_REGEX=${2:-.}
shift $(( $# >= 2 ? 2 : $# ))
mkdir -p "$LOG_DIR"

# The default c++ wrapper there links libstdc++ statically and the torch
# module then segfaults.
export CXX=/usr/bin/g++
export CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-90}
export MOONCAKE_BUILD_JOBS=${MOONCAKE_BUILD_JOBS:-16}
export MOONCAKE_BUILD_DIR=${MOONCAKE_BUILD_DIR:-$PWD/build-gpu}
export BUILD_FUZZERS=OFF
# Multicast stays off on shared GPU hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

status=0
step() {  # step NAME CMD...: runs CMD, logs to LOG_DIR/NAME.log, remembers a failure
    local name=$1
    shift
    echo "== $name: $*"
    local t0=$SECONDS
    "$@" > "$LOG_DIR/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    tail -n 40 "$LOG_DIR/$name.log"
    [ $rc -eq 0 ] || status=1
    return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$LOG_DIR/gpu.txt" 2>&1
cat "$LOG_DIR/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
            "devices", torch.cuda.device_count())' | tee -a "$LOG_DIR/gpu.txt"

if [ -n "${MC_GPU_TARGETS:-}" ]; then
    # Only the named targets (device time is short): configure as setup.py
    # does, build them, and copy any extension module built into python/.
    build_targets() {
        cmake -S . -B "$MOONCAKE_BUILD_DIR" -G Ninja -DPython3_EXECUTABLE="$(command -v python3)" \
            -DWITH_TORCH=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_FUZZERS=OFF \
            -DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES" \
            ${USE_NCCL_DEVICE:+-DUSE_NCCL_DEVICE="$USE_NCCL_DEVICE"} &&
            cmake --build "$MOONCAKE_BUILD_DIR" -j "$MOONCAKE_BUILD_JOBS" --target $MC_GPU_TARGETS &&
            { cp "$MOONCAKE_BUILD_DIR"/python/mooncake/*.so python/mooncake/ 2>/dev/null || true; }
    }
    step build build_targets || { echo "build failed"; exit 1; }
else
    step build python3 setup.py build_ext --inplace || { echo "build failed"; exit 1; }
fi

# MPS lets N processes on the one GPU run kernels concurrently; tests also
# pass without it, only slower.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mc-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mc-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if [ "${MC_GPU_NO_MPS:-0}" != 1 ] && nvidia-cuda-mps-control -d 2>/dev/null; then
    echo "MPS started"
    # quit returns before the daemon is gone; a caller that starts MPS again
    # right after this script meanwhile finds a half-stopped one, and its
    # CUDA processes then see no device. Wait (bounded) for it to go.
    stop_mps() {
        echo quit | nvidia-cuda-mps-control
        for _ in $(seq 50); do
            pgrep -x nvidia-cuda-mps-control > /dev/null || pgrep -x nvidia-cuda-mps-server > /dev/null || return 0
            sleep 0.2
        done
    }
    trap stop_mps EXIT
else
    echo "MPS not started: processes share the GPU by time slicing"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

if [ "$CTEST_REGEX" != "-" ]; then
    step ctest ctest --test-dir "$MOONCAKE_BUILD_DIR" --output-on-failure -j 8 --timeout 600 \
        --no-tests=error -R "$CTEST_REGEX"
fi
if [ $# -gt 0 ]; then
    step pytest env PYTHONPATH=python python3 -m pytest -q -rs "$@"
fi
for bench in ${MC_GPU_BENCH:-}; do
    step "bench_$(basename "$bench" .py)" env PYTHONPATH=python python3 "$bench"
done
exit $status
