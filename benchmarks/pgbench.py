#!/usr/bin/env python3
"""pgbench: torch.distributed collective benchmark in the style of nccl-tests.

    python benchmarks/pgbench.py --collective all_reduce --backend both --device cpu \\
        -g 2 -b 8 -e 1M -f 2 --json-output out.json

Starts -g ranks (spawn, env:// on a free port), or runs as one rank when
launched by torchrun (RANK/WORLD_SIZE set). With --backend both every rank
initialises the default group with mooncake-cpu and a second group with the
--peer backend (gloo unless told) over the same ranks, and the two are measured size by size, alternating, in the
same processes; the ratio table compares them.

Per size: warm-up, then --iters timed iterations back to back, split into
--rounds blocks that alternate between the backends (so both see the same
machine load). An iteration's time is the slowest rank's; the table reports its
median and p99. Bandwidths
follow nccl-tests: algbw = size / time, busbw = algbw * factor, with factor
2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter, all_to_all,
gather and scatter, and 1 for broadcast, reduce and sendrecv. "size" is the
whole buffer: the all_gather output, the reduce_scatter input, one rank's
all_to_all buffer. Each size is checked for correctness once before timing.

The same run also times a single-thread memcpy of each size on rank 0 (while
the other ranks wait) and prints every backend's busbw as a fraction of it:
one core's copy bandwidth is the yardstick a CPU collective is read against.

--device cuda: the backends are `mooncake` and gloo on the same CUDA tensors
(every rank on GPU 0: N processes share one GPU, run them under MPS). Ops are
timed as nccl-tests does, with CUDA events around each block of back-to-back
ops. The yardstick is HBM traffic: an op must read every input byte and write
every output byte once (all_reduce of S bytes per rank over N ranks: 2*N*S;
all_gather and reduce_scatter: (N+1)*S with S the larger side; all_to_all
and sendrecv, a ring of isend/irecv: 2*N*S), and its limit time is that traffic over the device copy bandwidth
(read + write) measured on rank 0 in the same run; each row prints its
fraction of that limit. The issue_us column is the host's time per op to
issue the block: when it is close to time_us the host, not the GPU, sets the
pace. Beside the run's smallest op, every rank also issues a bare CUDA op
(x.add_(1) on the same tensor size, backend cuda-launch) the same way: the
host's floor per op on this machine, which a host-paced collective cannot
beat; the "over_floor_us" table says what each op costs above it.

--gpus per-rank (with --device cuda): rank r runs on GPU LOCAL_RANK (one
process per GPU, as serving stacks run), and the yardstick is the GPU-to-GPU
link instead: rank 0 times a copy from GPU 0 to GPU 1 of the largest size in
the same run, and each row prints its busbw over that copy's bandwidth.
--peer nccl compares against NCCL instead of gloo (it needs --gpus per-rank:
NCCL refuses two ranks on one GPU).

--graph K (with --device cuda): the mooncake ops that can be captured are
also captured K to a CUDA graph and replayed (backend mooncake-graph, same
group, own buffers), as serving stacks run their decode step; time_us is a
replay's time over K. Captured calls always go through the group window, so
large sizes read slower than the eager rows, which share the members'
buffers directly.

The parts live beside this file: pgbench_bench.py holds the collectives, sizes,
Bench and GraphBench, the timed blocks and the copy yardsticks; pgbench_report.py
the tables derived from the rows (ratios, memcpy, HBM limit and link fractions)
and their printing. This file parses the options, starts the ranks and runs them.
"""

import argparse
import datetime
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
import traceback

from pgbench_bench import (COLLECTIVES, DTYPES, GLOO_CUDA_UNSUPPORTED, GRAPH_COLLECTIVES, LAUNCH_FLOOR,
                           MOONCAKE, MOONCAKE_CUDA, MOONCAKE_GRAPH, OPS, PEERS, TYPE_NAMES, Bench,
                           GraphBench, LaunchFloorBench,
                           bus_factor, device_copy_row, element_count, link_copy_row, measure,
                           memcpy_rows, mooncake_name, parse_size, percentile, plan_iters, sizes,
                           split_weight, sync)
from pgbench_report import (launch_floors, limit_fractions, link_fractions, memcpy_ratios, peer_of,
                            print_tables, ratios, traffic_bytes)

# The public names, those of pgbench_bench and pgbench_report among them (pgbench.X keeps working).
__all__ = [
    "COLLECTIVES", "DTYPES", "GLOO_CUDA_UNSUPPORTED", "GRAPH_COLLECTIVES", "LAUNCH_FLOOR", "MOONCAKE",
    "MOONCAKE_CUDA", "MOONCAKE_GRAPH", "OPS", "PEERS", "TYPE_NAMES", "Bench", "GraphBench",
    "LaunchFloorBench", "bus_factor", "device_copy_row",
    "element_count", "link_copy_row", "measure", "memcpy_rows", "mooncake_name", "parse_size", "percentile",
    "plan_iters", "sizes", "split_weight", "sync", "limit_fractions", "link_fractions", "memcpy_ratios",
    "peer_of", "print_tables", "ratios", "traffic_bytes", "launch_floors",
    "HERE", "REPO_PYTHON", "gpu_of", "rank_main", "launch", "main",
]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_PYTHON = os.path.join(os.path.dirname(HERE), "python")


def gpu_of(rank, args, torch):
    """The GPU this rank runs on: 0 for every rank (--gpus shared), else LOCAL_RANK."""
    if args.gpus == "shared":
        return 0
    local = int(os.environ.get("LOCAL_RANK", rank))
    have = torch.cuda.device_count()
    if local >= have:
        raise SystemExit(f"pgbench: --gpus per-rank: local rank {local} needs GPU {local}, but this "
                         f"host has {have} GPU(s); run at most {have} ranks per host or --gpus shared")
    return local


def rank_main(rank, n, args, result_path):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    mc = mooncake_name(args.device)
    backends = [mc, args.peer] if args.backend == "both" else [mc if args.backend == MOONCAKE else args.backend]
    if args.device == "cuda":
        torch.cuda.set_device(gpu_of(rank, args, torch))  # shared: N processes on GPU 0
    if mc in backends:
        if os.path.isdir(REPO_PYTHON) and REPO_PYTHON not in sys.path:
            sys.path.insert(0, REPO_PYTHON)
        from mooncake import pg  # noqa: F401  (registers mooncake-cpu)
    timeout = datetime.timedelta(seconds=args.timeout)
    init = {"init_method": "env://"}
    engine = None
    if args.engine == "shared" and mc in backends:
        # One store for the groups and (under a prefix) the shared engine.
        hosted = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), n,
                              is_master=(rank == 0 and not hosted), timeout=timeout)
        from mooncake.engine import TransferEngine
        engine = TransferEngine(dist.PrefixStore("pgbench-engine", store))
        pg.set_transfer_engine(engine)
        init = {"store": store}
    dist.init_process_group(backend=backends[0], rank=rank, world_size=n, timeout=timeout, **init)
    groups = {backends[0]: None}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
    ctrl = dist.new_group(backend="gloo")  # statistics travel here, never through a measured group
    dtype = getattr(torch, args.dtype)
    elt = torch.tensor([], dtype=dtype).element_size()
    colls = list(COLLECTIVES) if args.collective == "all" else args.collective.split(",")
    rows = []
    all_sizes = sizes(args)
    for coll in colls:
        for nbytes in all_sizes:
            count = element_count(coll, nbytes, elt, n)
            benches, checks = {}, {}

            def checked(b, bench):
                """Runs bench's check on every rank: "ok" or "FAILED" (any rank), or
                "unsupported" when the peer lacks the op on these tensors."""
                try:
                    err = bench.check()
                except RuntimeError as e:  # gloo lacks some ops on CUDA tensors
                    if b in PEERS:
                        if rank == 0:
                            print(f"# {b} {coll}: {str(e).splitlines()[0]}", flush=True)
                        return "unsupported"
                    err = f"raised: {e}"
                flags = torch.tensor([0 if err is None else 1])
                dist.all_reduce(flags, group=ctrl)
                if err and args.verbose:
                    print(f"[rank {rank}] {b} {coll} {count * elt} B check failed: {err}", flush=True)
                return "ok" if flags.item() == 0 else "FAILED"

            for b in backends:
                if b == "gloo" and args.device == "cuda" and coll in GLOO_CUDA_UNSUPPORTED:
                    # Tried, gloo fails the small messages with "Bad address" and
                    # aborts the process (an uncaught gloo::IoException) at 32 MiB.
                    if rank == 0 and nbytes == all_sizes[0]:
                        print(f"# gloo {coll}: not run, gloo has no {coll} on CUDA tensors",
                              flush=True)
                    checks[b] = "unsupported"
                    continue
                bench = Bench(torch, dist, coll, count, dtype, args.op, groups[b], rank, n, args.device)
                checks[b] = checked(b, bench) if args.check else "skipped"
                if checks[b] != "unsupported":
                    benches[b] = bench
            if args.graph > 0 and args.device == "cuda" and mc in backends and coll in GRAPH_COLLECTIVES:
                bench = GraphBench(torch, dist, coll, count, dtype, args.op, groups[mc], rank, n, args.graph)
                checks[MOONCAKE_GRAPH] = checked(MOONCAKE_GRAPH, bench) if args.check else "skipped"
                benches[MOONCAKE_GRAPH] = bench
            if args.device == "cuda" and coll == colls[0] and nbytes == all_sizes[0]:
                # Once per run, beside the smallest op: how much of its time the host's launch alone takes.
                bench = LaunchFloorBench(torch, dist, count, dtype, groups[backends[0]])
                checks[LAUNCH_FLOOR] = checked(LAUNCH_FLOOR, bench) if args.check else "skipped"
                benches[LAUNCH_FLOOR] = bench
            all_times, issue_times, worker_times = measure(benches, ctrl, args, dist, torch)
            for b in benches:
                times = all_times[b]
                med, p99 = statistics.median(times), percentile(times, 99)
                size = count * elt
                algbw = size / (med * 1e-6) / 1e9
                rows.append({"backend": b, "collective": coll, "size": size, "count": count,
                             "type": TYPE_NAMES[args.dtype],
                             "op": args.op if coll in ("all_reduce", "reduce", "reduce_scatter") else None,
                             "nranks": n, "iters": len(times), "time_us_median": med, "time_us_p99": p99,
                             "time_us_mean": statistics.fmean(times), "algbw_GBps": algbw,
                             "busbw_GBps": algbw * bus_factor(coll, n), "check": checks[b],
                             "engine": args.engine if b in (mc, MOONCAKE_GRAPH) else None,
                             "ops_per_graph": args.graph if b == MOONCAKE_GRAPH else None,
                             "issue_us_median": (statistics.median(issue_times[b])
                                                 if b in issue_times else None),
                             "worker_queued_us_mean": (worker_times[b][0] if b in worker_times
                                                       else None),
                             "worker_run_us_mean": (worker_times[b][1] if b in worker_times
                                                    else None),
                             "caller_launched_fraction": (worker_times[b][2]
                                                          if b in worker_times else None)})
                if rank == 0 and args.verbose:
                    print(f"  {b:>12} {coll:>14} {size:>12} B  {med:10.1f} us", flush=True)
            del benches
    if rank == 0:
        sizes_done = sorted({r["size"] for r in rows})
        if args.device == "cuda" and args.gpus == "per-rank":
            if torch.cuda.device_count() >= 2:
                rows.append(link_copy_row(torch, max(sizes_done[-1], 256 << 20), args))
        elif args.device == "cuda":
            rows.append(device_copy_row(torch, max(sizes_done[-1], 256 << 20), args))
        else:
            rows.extend(memcpy_rows(torch, sizes_done, args))
    dist.barrier(group=ctrl)
    dist.destroy_process_group()
    if engine is not None:
        engine.close()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(rows, f)


def _spawn_entry(rank, n, args, result_path, port, err_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(n), LOCAL_RANK=str(rank))
    try:
        rank_main(rank, n, args, result_path)
    except BaseException:  # noqa: BLE001
        with open(os.path.join(err_dir, f"rank{rank}.err"), "w") as f:
            f.write(f"[rank {rank}] " + traceback.format_exc())
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def launch(args):
    """Spawns -g ranks; returns rank 0's rows. Kills every rank after --timeout seconds."""
    import tempfile
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    tmp = tempfile.mkdtemp(prefix="pgbench_")
    result_path = os.path.join(tmp, "rows.json")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spawn_entry, args=(r, args.nranks, args, result_path, port, tmp))
             for r in range(args.nranks)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    failed = None
    while any(p.exitcode is None for p in procs):
        if time.monotonic() > deadline:
            failed = f"timed out after {args.timeout} s; ranks still running: " + \
                     str([r for r, p in enumerate(procs) if p.exitcode is None])
            break
        bad = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if bad and failed is None:
            failed = "ranks failed: " + ", ".join(f"{r} (exit code {procs[r].exitcode})" for r in bad)
            deadline = min(deadline, time.monotonic() + 10)
        time.sleep(0.1)
    for p in procs:
        if p.exitcode is None:
            p.kill()
        p.join()
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if failed or bad:
        failed = failed or "ranks failed: " + ", ".join(f"{r} (exit code {procs[r].exitcode})" for r in bad)
        errs = "".join(open(os.path.join(tmp, f)).read() for f in sorted(os.listdir(tmp)) if f.endswith(".err"))
        sys.exit(f"pgbench: {failed}\n{errs}")
    with open(result_path) as f:
        return json.load(f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collective", default="all_reduce",
                    help="one of %s, a comma-separated list of them, or all" % ", ".join(COLLECTIVES))
    ap.add_argument("--backend", default="both", choices=(MOONCAKE,) + PEERS + ("both",),
                    help="both: mooncake and --peer, side by side")
    ap.add_argument("--peer", default="gloo", choices=PEERS,
                    help="the reference backend of --backend both (nccl: --device cuda --gpus per-rank)")
    ap.add_argument("--gpus", default="shared", choices=("shared", "per-rank"),
                    help="cuda: every rank on GPU 0 (shared), or rank r on GPU LOCAL_RANK (per-rank)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: backend mooncake (and the peer) on CUDA tensors (see --gpus)")
    ap.add_argument("-g", "--nranks", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1M"))
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5,
                    help="with two backends, iterations run in this many alternating blocks")
    ap.add_argument("--min-iters", type=int, default=10, help="floor when --time-budget cuts iterations")
    ap.add_argument("--time-budget", type=float, default=2.0,
                    help="seconds per size and backend that bound the iterations (0: always --iters)")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--op", default="sum", choices=OPS)
    ap.add_argument("--engine", default="per-group", choices=("per-group", "shared"),
                    help="mooncake groups: an engine each, or one shared TransferEngine "
                         "(pg.set_transfer_engine)")
    ap.add_argument("--graph", type=int, default=0, metavar="K",
                    help="cuda: also time mooncake ops captured K per CUDA graph and replayed "
                         "(backend mooncake-graph); 0: off")
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the correctness check")
    ap.add_argument("--json-output", help="write config, rows and ratios as JSON to this file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds before every rank is killed")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    unknown = [c for c in args.collective.split(",") if c not in COLLECTIVES + ("all",)]
    if unknown:
        ap.error(f"--collective: unknown {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)} or all")
    if args.stepfactor <= 1:
        ap.error("-f must be > 1")
    if args.graph < 0 or (args.graph > 0 and args.device != "cuda"):
        ap.error(f"--graph {args.graph}: expected 0, or a positive op count with --device cuda")
    uses_nccl = args.backend == "nccl" or (args.backend == "both" and args.peer == "nccl")
    if uses_nccl and (args.device != "cuda" or args.gpus != "per-rank"):
        ap.error(f"nccl needs --device cuda --gpus per-rank (got --device {args.device} --gpus {args.gpus}): "
                 "NCCL takes CUDA tensors and refuses two ranks on one GPU")
    if args.gpus == "per-rank" and args.device != "cuda":
        ap.error("--gpus per-rank: expected --device cuda")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ:
        import tempfile
        n = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        path = os.path.join(tempfile.gettempdir(), f"pgbench_{os.environ['TORCHELASTIC_RUN_ID']}.json")
        rank_main(rank, n, args, path)
        if rank != 0:
            return 0
        with open(path) as f:
            rows = json.load(f)
    else:
        n = args.nranks
        rows = launch(args)
    rats = ratios(rows)
    print_tables(rows, rats, args, n)
    if args.json_output:
        cfg = {k: v for k, v in vars(args).items() if k != "json_output"}
        cfg["nranks"] = n
        with open(args.json_output, "w") as f:
            json.dump({"config": cfg, "results": rows, "ratios": rats,
                       "memcpy_ratios": memcpy_ratios(rows), "limit_fractions": limit_fractions(rows),
                       "link_fractions": link_fractions(rows), "launch_floors": launch_floors(rows)},
                      f, indent=1)
    return 1 if any(r["check"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
