"""Runs the C++ pg_device_bench from scripts/gpu_check.sh (MC_GPU_BENCH takes
Python scripts, and this keeps the run under the MPS daemon the script
started). Arguments come from PG_DEVICE_BENCH_ARGS; the binary from
$MOONCAKE_BUILD_DIR (default ./build-gpu). Output: the binary's JSON lines."""
import os
import shlex
import subprocess
import sys

build = os.environ.get("MOONCAKE_BUILD_DIR", os.path.join(os.getcwd(), "build-gpu"))
binary = os.path.join(build, "benchmarks", "pg_device_bench", "pg_device_bench")
if not os.path.exists(binary):
    sys.exit(f"{binary} is missing: build the pg_device_bench target")
args = shlex.split(os.environ.get("PG_DEVICE_BENCH_ARGS", ""))
timeout = float(os.environ.get("PG_DEVICE_BENCH_TIMEOUT_S", "900"))
try:
    sys.exit(subprocess.run([binary, *args], timeout=timeout).returncode)
except subprocess.TimeoutExpired:
    sys.exit(f"pg_device_bench ran past {timeout} s")
