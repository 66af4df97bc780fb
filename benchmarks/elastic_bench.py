#!/usr/bin/env python3
"""elastic_bench: how long mooncake-cpu's elastic recovery takes, and what it costs after.

    python benchmarks/elastic_bench.py [--size 4M] [--iters 30] [--json-output out.json]

4 ranks (mooncake-cpu, max_group_size 4), spawned with tests/python/harness.py.
Prints one JSON object:

* kill_to_failed_completion_s.{default,deferred}: from the SIGKILL of rank 3
  (taken in the middle of an all_reduce the others already entered) to the
  survivors' failed completion (work.wait() returning or raising), per
  survivor and the max. The default mode includes the automatic
  sync_after_failure (reconciliation window); the deferred mode does not, and
  its sync_after_failure time is reported separately.
* join_to_first_collective_s: on the replacement of rank 3, from calling
  join_group to the end of the first all_reduce that includes it (the
  survivors poll get_peer_state and rank 0 calls recover_ranks meanwhile).
* all_reduce_{before,after}: --size bytes of float32, median (and p90) per
  iteration over --iters iterations on rank 0, among the 4 founders before the
  kill and among the 3 survivors + the replacement after recovery;
  after_over_before is the ratio of the medians (about 1: no lasting slowdown).

Timestamps come from CLOCK_MONOTONIC, which all processes on one machine share.
MC_PG_TIMEOUT_MS / MC_PG_RECONCILE_WINDOW_MS default to --timeout-ms / --window-ms.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, "tests", "python")]

import harness  # noqa: E402

N = 4
VICTIM = 3


def parse_size(text):
    t = text.strip().upper().replace("IB", "").rstrip("B")
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            return int(float(t[:-1]) * m)
    return int(t)


def _options(mode, is_extension=False):
    from mooncake import pg
    if mode == "default":
        return pg.MooncakeBackendOptions(N, is_extension)
    return pg.MooncakeBackendOptions(N, is_extension, True, False)


def _throughput(numel, iters, rank):
    import torch
    import torch.distributed as dist
    t = torch.full((numel,), float(rank + 1))
    for _ in range(3):  # warm-up
        dist.all_reduce(t)
    times = []
    for _ in range(iters):
        t.fill_(float(rank + 1))
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    want = float(sum(r + 1 for r in range(N)))
    if not bool(t.eq(want).all()):
        raise AssertionError(f"all_reduce result {t[0].item()} != {want}")
    return times


def _wait_event(ctx, name, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while not ctx.signalled(name):
        if ctx.signalled("abort"):
            raise RuntimeError(f"aborted: {ctx.event_payload('abort')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"event {name} not signalled within {timeout_s} s")
        time.sleep(0.002)


def _worker(ctx, mode, numel, iters):
    """Procs 0..3: founders (3 is killed). Proc 4 (default mode only): replacement of 3."""
    import torch
    import torch.distributed as dist
    from mooncake import pg
    out = {}
    try:
        if ctx.rank == 4:
            dist.init_process_group(backend=ctx.backend, init_method="env://", rank=VICTIM, world_size=N,
                                    pg_options=_options(mode, True))
            t_join = time.monotonic()
            ctx.signal("joining")
            pg.join_group(dist.group.WORLD)
            out["join_group_s"] = time.monotonic() - t_join
            t = torch.full((8,), float(VICTIM + 1))
            dist.all_reduce(t)
            out["join_to_first_collective_s"] = time.monotonic() - t_join
            if t[0].item() != float(sum(r + 1 for r in range(N))):
                raise AssertionError(f"first all_reduce after the join gave {t[0].item()}")
            out["after"] = _throughput(numel, iters, VICTIM)
            _leave(ctx)
            return out
        rank = ctx.rank
        dist.init_process_group(backend=ctx.backend, init_method="env://", rank=rank, world_size=N,
                                pg_options=_options(mode))
        if mode == "default":
            out["before"] = _throughput(numel, iters, rank)
        big = torch.full((4 << 20,), rank + 1, dtype=torch.int32)
        if rank == VICTIM:
            for r in range(N - 1):
                _wait_event(ctx, f"entered_{r}")
            dist.all_reduce(big, async_op=True)
            time.sleep(0.002)
            ctx.signal("killed_at", repr(time.monotonic()))
            ctx.kill_self()
        work = dist.all_reduce(big, async_op=True)
        ctx.signal(f"entered_{rank}")
        try:
            work.wait()
        except Exception as e:  # noqa: BLE001 - the failed op raises
            out["error"] = f"{type(e).__name__}: {e}"[:300]
        t_done = time.monotonic()
        _wait_event(ctx, "killed_at")
        out["kill_to_failed_completion_s"] = t_done - float(ctx.event_payload("killed_at"))
        ls = work.local_success
        out["local_success"] = bool(ls() if callable(ls) else ls)
        hint = work.failed_ranks_hint
        out["failed_ranks_hint"] = (hint() if callable(hint) else hint).tolist()
        if mode == "deferred":
            t0 = time.monotonic()
            pg.sync_after_failure(dist.group.WORLD)
            out["sync_after_failure_s"] = time.monotonic() - t0
        out["active_after_failure"] = pg.get_active_ranks(dist.group.WORLD).tolist()
        if mode == "default":
            if rank == 0:
                ctx.signal("launch_replacement")
                _wait_event(ctx, "joining")
                while not all(pg.get_peer_state(dist.group.WORLD, [VICTIM])):
                    time.sleep(0.001)
                pg.recover_ranks(dist.group.WORLD, [VICTIM])
            else:
                while int(pg.get_active_ranks(dist.group.WORLD)[VICTIM]) != 1:
                    time.sleep(0.001)
            t = torch.full((8,), float(rank + 1))
            dist.all_reduce(t)
            out["after"] = _throughput(numel, iters, rank)
        if rank != 0:
            _leave(ctx)
        else:  # the store / Coordinator host goes last
            others = [r for r in range(1, N + (1 if mode == "default" else 0)) if r != VICTIM]
            for r in others:
                _wait_event(ctx, f"left_{r}")
        return out
    except BaseException as e:
        ctx.signal("abort", f"proc {ctx.rank}: {type(e).__name__}: {e}"[:1000])
        raise


def _leave(ctx):
    import torch.distributed as dist
    try:
        dist.destroy_process_group()
    finally:
        ctx.signal(f"left_{ctx.rank}")


def _summary(values):
    values = sorted(values)
    return {"median_s": statistics.median(values), "p90_s": values[min(len(values) - 1, int(0.9 * len(values)))],
            "min_s": values[0], "n": len(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="4M", help="all_reduce bytes for the throughput check (default 4M)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--timeout-ms", type=int, default=int(os.environ.get("MC_PG_TIMEOUT_MS", 3000)))
    ap.add_argument("--window-ms", type=int, default=int(os.environ.get("MC_PG_RECONCILE_WINDOW_MS", 4000)))
    ap.add_argument("--job-timeout-s", type=float, default=300)
    ap.add_argument("--json-output", default=None)
    args = ap.parse_args()
    size = parse_size(args.size)
    numel = max(1, size // 4)
    env = {"MC_PG_TIMEOUT_MS": str(args.timeout_ms), "MC_PG_RECONCILE_WINDOW_MS": str(args.window_ms)}
    report = {"backend": "mooncake-cpu", "ranks": N, "size_bytes": numel * 4, "iters": args.iters,
              "MC_PG_TIMEOUT_MS": args.timeout_ms, "MC_PG_RECONCILE_WINDOW_MS": args.window_ms,
              "cpu_count": os.cpu_count()}

    runs = {}
    for mode in ("default", "deferred"):
        procs = N + 1 if mode == "default" else N
        late = {4: "launch_replacement"} if mode == "default" else None
        t0 = time.monotonic()
        try:
            runs[mode] = harness.run_ranks(_worker, procs, "mooncake-cpu", timeout_s=args.job_timeout_s,
                                           env=env, args=(mode, numel, args.iters), init=False,
                                           ref_group=False, late=late, expect_killed=[VICTIM])
        except harness.WorkersFailed as e:
            report[f"{mode}_error"] = str(e)[-4000:]
            runs[mode] = None
        report[f"{mode}_wall_s"] = round(time.monotonic() - t0, 1)

    kill = {}
    for mode, res in runs.items():
        if res is None:
            continue
        survivors = [res[r] for r in range(N) if r != VICTIM]
        per = [s["kill_to_failed_completion_s"] for s in survivors]
        kill[mode] = {"per_survivor_s": [round(x, 3) for x in per], "max_s": round(max(per), 3),
                      "local_success": [s["local_success"] for s in survivors],
                      "failed_ranks_hint": survivors[0]["failed_ranks_hint"],
                      "active_after_failure": survivors[0]["active_after_failure"],
                      "wait_raised": [s.get("error") for s in survivors]}
        if mode == "deferred":
            kill[mode]["sync_after_failure_s"] = [round(s["sync_after_failure_s"], 3) for s in survivors]
    report["kill_to_failed_completion_s"] = kill

    res = runs.get("default")
    if res is not None:
        repl = res[4]
        report["join_group_s"] = round(repl["join_group_s"], 3)
        report["join_to_first_collective_s"] = round(repl["join_to_first_collective_s"], 3)
        before, after = _summary(res[0]["before"]), _summary(res[0]["after"])
        for s in (before, after):
            s["algbw_GBps"] = round(numel * 4 / s["median_s"] / 1e9, 3)
            for k in ("median_s", "p90_s", "min_s"):
                s[k] = round(s[k], 6)
        report["all_reduce_before"] = before
        report["all_reduce_after"] = after
        report["after_over_before"] = round(after["median_s"] / before["median_s"], 3)

    text = json.dumps(report, indent=2)
    print(text)
    if args.json_output:
        with open(args.json_output, "w") as f:
            f.write(text + "\n")
    return 0 if all(r is not None for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
