#!/usr/bin/env bash
# Builds the fuzz targets with clang (libFuzzer, ASan, UBSan) in build-fuzz/,
# a CMake build of tests/fuzz alone (the main build stays g++), and runs each
# for MC_FUZZ_SECONDS (default 40, at most 600) from its checked-in corpus
# tests/fuzz/corpus/<name>, with a fresh random seed. Prints the executions
# per fuzzer. A crash fails the script and leaves the input under
# build-fuzz/artifacts/ (add it to the corpus together with the fix).
#
#   MC_FUZZ_SECONDS=5 bash scripts/run_fuzzers.sh [fuzzer...]
#
# Without clang's libFuzzer it falls back to the g++ replay drivers of the
# main build (build/tests/fuzz), MC_FUZZ_RUNS inputs each, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(frame_fuzzer tcp_stream_fuzzer segment_desc_fuzzer endpoint_fuzzer rdma_metadata_fuzzer
     control_message_fuzzer control_sequence_fuzzer)
FUZZERS=("${@:-${ALL[@]}}")
SECS=${MC_FUZZ_SECONDS:-40}
if ! [[ "$SECS" =~ ^[0-9]+$ ]] || [ "$SECS" -lt 1 ] || [ "$SECS" -gt 600 ]; then
    echo "run_fuzzers: MC_FUZZ_SECONDS=$SECS, expected 1..600" >&2
    exit 2
fi
CORPUS=tests/fuzz/corpus

have_libfuzzer() {
    command -v clang++ >/dev/null || return 1
    local probe
    probe=$(mktemp -d)
    echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) {return 0;}' \
        > "$probe/p.cc"
    clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" 2>/dev/null
    local rc=$?
    rm -rf "$probe"
    return $rc
}

run_replay() {
    echo "run_fuzzers: clang with libFuzzer not found: replay drivers (g++, no sanitizer)" >&2
    local runs=${MC_FUZZ_RUNS:-200000}
    for f in "${FUZZERS[@]}"; do
        cmake --build build -j "${MOONCAKE_BUILD_JOBS:-2}" --target "$f" >/dev/null
        local line
        line=$(build/tests/fuzz/"$f" -runs="$runs" -seed=0 "$CORPUS/$f" | tail -1)
        echo "fuzz: $f: $runs executions (replay, no sanitizer): $line"
    done
}

run_libfuzzer() {
    CC=clang CXX=clang++ cmake -S tests/fuzz -B build-fuzz -G Ninja \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build-fuzz -j "${MOONCAKE_BUILD_JOBS:-2}" --target "${FUZZERS[@]}"
    mkdir -p build-fuzz/artifacts
    local failed=()
    for f in "${FUZZERS[@]}"; do
        local work
        work=$(mktemp -d)
        mkdir "$work/corpus"
        # New inputs go to the scratch corpus; the checked-in one is read only.
        set +e
        timeout $((SECS + 120)) build-fuzz/"$f" -max_total_time="$SECS" -print_final_stats=1 \
            -max_len=4096 -timeout=20 -rss_limit_mb=2048 -artifact_prefix="$work/" \
            "$work/corpus" "$CORPUS/$f" >"$work/log" 2>&1
        local rc=$?
        set -e
        local execs seed
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
        seed=$(sed -n 's/^INFO: Seed: *//p' "$work/log" | head -1)
        if [ $rc -ne 0 ]; then
            failed+=("$f")
            cp -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* \
                build-fuzz/artifacts/ 2>/dev/null || true
            tail -40 "$work/log"
            echo "fuzz: $f: FAILED (exit $rc, seed $seed) after ${execs:-?} executions;" \
                "inputs in build-fuzz/artifacts/"
        else
            echo "fuzz: $f: ${execs:-?} executions in ${SECS} s (seed $seed, $(ls "$work/corpus" |
                wc -l) new corpus inputs)"
        fi
        rm -rf "$work"
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "run_fuzzers: failed: ${failed[*]}" >&2
        return 1
    fi
}

if have_libfuzzer; then
    run_libfuzzer
else
    run_replay
fi
