#!/usr/bin/env bash
# The runs of a machine with several GPUs (one process per GPU), in stages
# that each fit one device call:
#
#   bash scripts/multi_gpu_check.sh LOG_DIR [STAGE...]
#
#   build     the torch modules, ep_tests and pg_device_tests with the NCCL
#             device API (USE_NCCL_DEVICE=ON), through scripts/gpu_check.sh
#   tests     the mooncake CUDA tests and the EP fast-path tests with rank r on
#             GPU r (MC_TEST_GPUS=per-rank) at 2 ranks and at the GPU count
#             (MC_TEST_WORLD_SIZE), and the two-GPU ElasticBuffer tests
#             (replacement through PG, auto -> NCCL and the IPC path)
#   pgbench   pgbench.py mooncake against nccl on those GPUs: all_reduce,
#             all_gather, reduce_scatter, all_to_all from 8 B to 1 GiB
#   ep        ep_benchmark at 128 tokens per rank, hidden 7168, top-8, 256
#             experts (and 288 on 8 GPUs), FP8 dispatch / BF16 combine: the
#             Buffer over NVLink P2P with the fallback in the same run
#             (--compare) and the ElasticBuffer's NCCL transport; and BF16
#             dispatch over P2P, the setting of NCCL EP's published figure
#   configs   ep_benchmark's three routing configs, each with its plot
#
# With no STAGE every stage runs (more than one device call holds: run them
# one call each). Logs and JSON go to LOG_DIR; each step's time is printed.
# NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0 and
# friends), and nothing here calls cuMulticastCreate.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${1:?usage: multi_gpu_check.sh LOG_DIR [build|tests|pgbench|ep|configs ...]}
shift
STAGES=${*:-build tests pgbench ep configs}
mkdir -p "$LOG_DIR"

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=python
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
echo "GPUs: $GPUS; stages: $STAGES"
if [ "$GPUS" -lt 2 ]; then
    echo "multi_gpu_check.sh needs at least 2 GPUs (found $GPUS): on one GPU use scripts/gpu_check.sh"
    exit 2
fi

status=0
step() {  # step NAME TIMEOUT_S CMD...: logs to LOG_DIR/NAME.log, remembers a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$LOG_DIR/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    tail -n 15 "$LOG_DIR/$name.log"
    [ $rc -eq 0 ] || status=1
}

for stage in $STAGES; do
    case $stage in
    build)
        # gpu_check.sh builds the targets (-j16, CXX=/usr/bin/g++) and runs no test.
        USE_NCCL_DEVICE=ON MC_GPU_TARGETS="pg_2_11_0 ep_2_11_0 ep_tests pg_device_tests" \
            step build 580 bash scripts/gpu_check.sh "$LOG_DIR/build" -
        ;;
    tests)
        export MC_TEST_GPUS=per-rank MC_TEST_WORLD_SIZE=$GPUS
        step pg_cuda_tests 400 python3 -m pytest -q -rs --timeout=300 \
            tests/python/pg/test_cuda.py tests/python/pg/test_cuda_kernels.py \
            tests/python/pg/test_cuda_graphs.py tests/python/pg/test_cuda_failures.py \
            -k "${MC_MULTI_PG_K:-values_on_cuda and kernels] or stream_semantics or several_streams or queued_back_to_back or replay_exactly or (sigkilled and kernels])}"
        step ep_fast_tests 300 python3 -m pytest -q -rs --timeout=240 tests/python/ep/test_ep_fast.py
        unset MC_TEST_GPUS MC_TEST_WORLD_SIZE
        step elastic_buffer_two_gpus 200 python3 -m pytest -q -rs --timeout=180 \
            tests/python/ep/test_elastic_buffer_gpu.py -k "two_gpus"
        ;;
    pgbench)
        step pgbench 580 python3 benchmarks/pgbench.py --device cuda --gpus per-rank \
            --backend both --peer nccl -g "$GPUS" \
            --collective all_reduce,all_gather,reduce_scatter,all_to_all -b 8 -e 1G -f 8 \
            --time-budget 1 --json-output "$LOG_DIR/pgbench_${GPUS}gpus.json"
        ;;
    ep)
        ep() {  # ep NAME ARGS...: one ep_benchmark run on every GPU, JSON in LOG_DIR
            local name=$1
            shift
            step "ep_$name" 150 python3 benchmarks/ep_benchmark/run_ep_benchmark.py \
                --num-ranks "$GPUS" --master-port $((29700 + RANDOM % 200)) --pg-backend nccl \
                --num-tokens 128 --hidden-size 7168 --top-k 8 --dtype fp8 --align-ranks \
                --launch-pad-us 2000 --warmup-iters 10 --iters 50 \
                --json-output "$LOG_DIR/ep_$name.json" "$@"
        }
        ep p2p_vs_fallback_256 --num-experts 256 --compare
        ep nccl_transport_256 --num-experts 256 --ep-transport nccl
        # NCCL EP's published 8-GPU figure is for BF16 dispatch (docs/ep-guide.md,
        # "Published anchors for the 8-GPU run"); the last --dtype wins.
        ep p2p_bf16_256 --num-experts 256 --dtype bf16
        if [ "$GPUS" -ge 8 ]; then
            ep p2p_288 --num-experts 288
            ep nccl_transport_288 --num-experts 288 --ep-transport nccl
        fi
        ;;
    configs)
        for config in cuda_uniform cuda_incast_k_hot cuda_zipfian; do
            step "ep_config_$config" 200 python3 benchmarks/ep_benchmark/run_ep_benchmark.py \
                --config "benchmarks/ep_benchmark/configs/$config.json" --num-ranks "$GPUS" \
                --master-port $((29700 + RANDOM % 200)) --json-output "$LOG_DIR/ep_$config.json" \
                --plot "$LOG_DIR/ep_$config.png"
        done
        ;;
    *)
        echo "unknown stage '$stage': expected build, tests, pgbench, ep or configs"
        exit 2
        ;;
    esac
done
exit $status
