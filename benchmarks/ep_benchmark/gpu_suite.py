#!/usr/bin/env python3
"""The GPU machine's EP benchmark runs (scripts/gpu_check.sh runs it via MC_GPU_BENCH).

8 processes on the one GPU (MPS), a mooncake-cpu control group (MC_EP_GROUP
names another, e.g. mooncake for the CUDA one; the file names then carry
it), 128 tokens per rank, hidden 7168, top-8, 256 experts, FP8 dispatch / BF16 combine:
  1. --compare --align-ranks: fast path and fallback in one run (JSON + plot),
     each op timed after a barrier (8 ranks share the GPU: without it an op's
     latency is mostly the other ranks' expert forward),
  2. the three configs (configs/cuda_*.json) on the fast path, with the same
     overrides (their nccl group cannot put 8 ranks on one GPU, and their
     1024 tokens per rank would need 8 x 15 GB of EP buffers).
  3. with MC_EP_SUITE=full (or "all" for 1-3): the three configs at their own
     1024 tokens per rank with 4 processes (4 x 15 GB of EP buffers fit on
     the one GPU, 8 do not) and a `mooncake` (CUDA) control group, since
     their nccl group cannot put several ranks on one GPU.
Results go to $OUT/bench (or /tmp/ep_bench); each run is bounded by a timeout,
and a run of 8 that fails is retried with 4 processes (reported as such).
"""

import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.environ.get("OUT", "/tmp"), "bench")
GROUP = os.environ.get("MC_EP_GROUP", "mooncake-cpu")
TAG = "" if GROUP == "mooncake-cpu" else f"_{GROUP}"
COMMON = ["--pg-backend", GROUP, "--num-tokens", "128", "--hidden-size", "7168",
          "--top-k", "8", "--num-experts", "256", "--dtype", "fp8"]
CONFIGS = ("cuda_uniform", "cuda_incast_k_hot", "cuda_zipfian")


def run(name, extra, ranks, timeout_s, port, common=COMMON):
    if common is COMMON:
        name += TAG
    out = os.path.join(OUT, f"{name}_{ranks}.json")
    cmd = [sys.executable, os.path.join(HERE, "run_ep_benchmark.py"), "--num-ranks", str(ranks),
           "--master-port", str(port), "--json-output", out, *common, *extra]
    print("$", " ".join(cmd), flush=True)
    log = os.path.join(OUT, f"{name}_{ranks}.log")
    env = dict(os.environ, EP_BENCH_STACKS_AFTER_S=str(timeout_s - 10))
    with open(log, "w") as f:  # streamed, so a run that is killed still leaves its log
        # A session of its own: a run past its timeout goes with every rank it
        # spawned, or ranks spinning on the GPU would stall the runs after it.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    if rc != 0 or not os.path.exists(out):
        with open(log) as f:
            print(f"{name}: rc={rc}; log tail:\n{f.read()[-3000:]}", flush=True)
        return None
    with open(out) as f:
        doc = json.load(f)
    m = doc["metrics"]
    line = {"run": name, "ranks": ranks, "path": doc.get("ep_path"),
            "dispatch_ms": {k: m["dispatch_latency_ms"][k] for k in ("p50", "p99")},
            "combine_ms": {k: m["combine_latency_ms"][k] for k in ("p50", "p99")},
            "e2e_ms_mean": m["end_to_end_latency_ms"]["mean"],
            "tokens_per_second": m["tokens_per_second"],
            "imbalance_ratio": m["expert_load"]["imbalance_ratio"],
            "bandwidth": doc.get("bandwidth"), "compare": doc.get("compare")}
    print("SUMMARY " + json.dumps(line), flush=True)
    return doc


def config_args(cfg):
    return ["--config", os.path.join(HERE, "configs", f"{cfg}.json")]


def main():
    os.makedirs(OUT, exist_ok=True)
    port = 29600
    suite = os.environ.get("MC_EP_SUITE", "small")
    if suite in ("full", "all"):
        # The configs' own sizes (seed defaults: 1024 tokens, hidden 7168,
        # top-8, 256 experts, bf16), only the group and the rank count set.
        for i, cfg in enumerate(CONFIGS):
            run(f"{cfg}_1024", [*config_args(cfg), "--pg-backend", "mooncake"], 4, 100,
                port + 20 + i, common=[])
        if suite == "full":
            return
    compare = ["--compare", "--align-ranks", "--iters", "30", "--warmup-iters", "5",
               "--plot", os.path.join(OUT, "ep_compare.png")]
    if run("compare_aligned", compare, 8, 110, port) is None:
        run("compare_aligned", compare, 4, 80, port + 1)
    for i, cfg in enumerate(CONFIGS):
        extra = config_args(cfg)
        if cfg == "cuda_incast_k_hot":
            extra += ["--plot", os.path.join(OUT, "ep_k_hot.png")]
        run(cfg, extra, 8, 60, port + 10 + i)


if __name__ == "__main__":
    main()
