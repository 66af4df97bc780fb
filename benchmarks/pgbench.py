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
pace.

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
"""

import argparse
import datetime
import json
import math
import multiprocessing
import os
import socket
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_PYTHON = os.path.join(os.path.dirname(HERE), "python")

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "reduce",
               "gather", "scatter", "sendrecv")
MOONCAKE = "mooncake-cpu"
MOONCAKE_CUDA = "mooncake"
MOONCAKE_GRAPH = "mooncake-graph"
# What the mooncake backend can capture in a CUDA graph (docs/pg-user-guide.md).
GRAPH_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


PEERS = ("gloo", "nccl")
# Ops gloo cannot run on CUDA tensors at all; the peer is not tried on them.
GLOO_CUDA_UNSUPPORTED = ("sendrecv",)


def mooncake_name(device):
    return MOONCAKE_CUDA if device == "cuda" else MOONCAKE
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64")
OPS = ("sum", "avg", "prod", "min", "max")
TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16",
              "int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64"}


def parse_size(text):
    t = text.strip().upper().replace("IB", "").rstrip("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    return int(float(t) * mult)


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def sizes(args):
    out, s = [], args.minbytes
    while s <= args.maxbytes:
        out.append(s)
        nxt = int(s * args.stepfactor)
        s = nxt if nxt > s else s + 1
    return out


def split_weight(s, q, n):
    """all_to_all_v: rank s sends rank q this many units (1 to n, uneven); every
    rank's weights sum to the same total, so every rank's input and output
    have the same size while the splits differ."""
    return 1 + (s + q) % n


def element_count(coll, nbytes, elt, n):
    count = max(1, nbytes // elt)
    if coll == "all_to_all_v":
        total = sum(split_weight(0, q, n) for q in range(n))
        return max(total, count // total * total)
    if coll in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        count = max(n, count // n * n)  # whole buffer split evenly over the ranks
    return count


# --------------------------------------------------------------------------- one rank

class Bench:
    """Buffers and the operation for one (collective, size, group) on this rank."""

    def __init__(self, torch, dist, coll, count, dtype, op, group, rank, n, device="cpu"):
        self.torch, self.dist = torch, dist
        self.device = device
        self.coll, self.count, self.dtype, self.group, self.rank, self.n = coll, count, dtype, group, rank, n
        self.op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT,
                   "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
        self.op_name = op
        z = lambda k: torch.zeros(k, dtype=dtype, device=device)  # noqa: E731
        per = count // n
        if coll in ("all_reduce", "broadcast", "reduce"):
            self.buf = z(count)
        elif coll == "all_gather":
            self.inp, self.out = z(per), z(count)
        elif coll == "reduce_scatter":
            self.inp, self.out = z(count), z(per)
        elif coll == "all_to_all":
            self.inp, self.out = z(count), z(count)
        elif coll == "all_to_all_v":
            unit = count // sum(split_weight(0, q, n) for q in range(n))
            self.send = [unit * split_weight(rank, q, n) for q in range(n)]
            self.recv = [unit * split_weight(s, rank, n) for s in range(n)]
            self.inp, self.out = z(count), z(count)
        elif coll == "gather":
            self.inp = z(per)
            self.lst = [z(per) for _ in range(n)] if rank == 0 else None
        elif coll == "scatter":
            self.out = z(per)
            self.lst = [z(per) for _ in range(n)] if rank == 0 else None
        elif coll == "sendrecv":
            self.inp, self.out = z(count), z(count)

    def run(self):
        d, g = self.dist, self.group
        c = self.coll
        if c == "all_reduce":
            d.all_reduce(self.buf, op=self.op, group=g)
        elif c == "broadcast":
            d.broadcast(self.buf, src=0, group=g)
        elif c == "reduce":
            d.reduce(self.buf, dst=0, op=self.op, group=g)
        elif c == "all_gather":
            d.all_gather_into_tensor(self.out, self.inp, group=g)
        elif c == "reduce_scatter":
            d.reduce_scatter_tensor(self.out, self.inp, op=self.op, group=g)
        elif c == "all_to_all":
            d.all_to_all_single(self.out, self.inp, group=g)
        elif c == "all_to_all_v":
            d.all_to_all_single(self.out, self.inp, self.recv, self.send, group=g)
        elif c == "gather":
            d.gather(self.inp, gather_list=self.lst, dst=0, group=g)
        elif c == "scatter":
            d.scatter(self.out, scatter_list=self.lst, src=0, group=g)
        elif c == "sendrecv":
            nxt, prv = (self.rank + 1) % self.n, (self.rank - 1) % self.n
            works = [d.isend(self.inp, nxt, group=g), d.irecv(self.out, prv, group=g)]
            for w in works:
                w.wait()

    def check(self):
        """One run with known data; returns None if the result is right, else a message."""
        torch, r, n, c = self.torch, self.rank, self.n, self.coll
        val = lambda q: float(q + 1)  # noqa: E731
        if c in ("all_reduce", "reduce"):
            self.buf.fill_(val(r))
            self.run()
            if c == "reduce" and r != 0:
                return None
            vals = [val(q) for q in range(n)]
            want = {"sum": sum(vals), "avg": sum(vals) / n, "prod": math.prod(vals),
                    "min": min(vals), "max": max(vals)}[self.op_name]
            return _expect(torch, self.buf, torch.full_like(self.buf, want))
        if c == "broadcast":
            self.buf.fill_(val(r))
            self.run()
            return _expect(torch, self.buf, torch.full_like(self.buf, val(0)))
        if c == "all_gather":
            self.inp.fill_(val(r))
            self.run()
            want = torch.cat([torch.full_like(self.inp, val(q)) for q in range(n)])
            return _expect(torch, self.out, want)
        if c == "reduce_scatter":
            if self.op_name != "sum":
                return None
            self.inp.copy_(torch.arange(self.count).remainder(7).to(self.inp.dtype))
            self.run()
            per = self.count // n
            want = torch.arange(self.count).remainder(7)[r * per:(r + 1) * per].to(torch.float64) * n
            return _expect(torch, self.out, want.to(self.out.dtype).to(self.out.device))
        if c == "all_to_all_v":
            at = 0
            for q in range(n):
                self.inp[at:at + self.send[q]].fill_(float((r * n + q) % 100))
                at += self.send[q]
            self.run()
            want = torch.cat([torch.full((self.recv[s],), float((s * n + r) % 100), dtype=self.out.dtype,
                                         device=self.out.device) for s in range(n)])
            return _expect(torch, self.out, want)
        if c == "all_to_all":
            per = self.count // n
            for d in range(n):
                self.inp[d * per:(d + 1) * per].fill_(float((r * n + d) % 100))
            self.run()
            want = torch.cat([torch.full((per,), float((s * n + r) % 100), dtype=self.out.dtype,
                                         device=self.out.device) for s in range(n)])
            return _expect(torch, self.out, want)
        if c == "gather":
            self.inp.fill_(val(r))
            self.run()
            if r != 0:
                return None
            return _expect(torch, torch.cat(self.lst), torch.cat([torch.full_like(self.inp, val(q)) for q in range(n)]))
        if c == "scatter":
            if r == 0:
                for q, t in enumerate(self.lst):
                    t.fill_(val(q))
            self.run()
            return _expect(torch, self.out, torch.full_like(self.out, val(r)))
        if c == "sendrecv":
            self.inp.fill_(val(r))
            self.run()
            return _expect(torch, self.out, torch.full_like(self.out, val((r - 1) % n)))
        return None


class GraphBench(Bench):
    """A Bench whose run() replays a CUDA graph of `ops` back-to-back ops of the
    group (captured once, after one eager op that sets up the group's device
    state). check() replays a graph of one op and raises a replay's failure."""

    def __init__(self, torch, dist, coll, count, dtype, op, group, rank, n, ops):
        super().__init__(torch, dist, coll, count, dtype, op, group, rank, n, "cuda")
        self.ops_per_run = ops
        super().run()
        torch.cuda.synchronize()
        self.single = self._capture(1)
        self.many = self._capture(ops)
        self.graph = self.many

    def _capture(self, ops):
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(graph):
            for _ in range(ops):
                super().run()
        return graph

    def run(self):
        self.graph.replay()

    def check(self):
        from mooncake import pg
        self.graph = self.single
        try:
            err = super().check()
            self.torch.cuda.synchronize()
            pg.check_graph_replays(self.group or self.dist.group.WORLD)
            return err
        finally:
            self.graph = self.many
            # Zeros stay zeros however many times the graph reduces them.
            for name in ("buf", "inp", "out"):
                if hasattr(self, name):
                    getattr(self, name).zero_()


def _expect(torch, got, want):
    got, want = got.cpu(), want.cpu()
    if torch.equal(got, want):
        return None
    bad = (got != want).reshape(-1).nonzero().reshape(-1)
    i = int(bad[0])
    return (f"{len(bad)} of {got.numel()} elements wrong, first at {i}: got {got.reshape(-1)[i].item()}, "
            f"expected {want.reshape(-1)[i].item()}")


def plan_iters(bench, ctrl, args, dist, torch):
    """Warm-up, then the iteration count all ranks agree on (bounded by --time-budget)."""
    for _ in range(args.warmup):
        bench.run()
    if args.time_budget <= 0:
        return args.iters
    sync(torch, args)
    t0 = time.perf_counter()
    bench.run()
    sync(torch, args)
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX, group=ctrl)
    return max(min(args.iters, args.min_iters), min(args.iters, int(args.time_budget / max(one.item(), 1e-9))))


def _fmt_opt(v):
    return "-" if v is None else f"{v:.2f}"


def sync(torch, args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def _worker_stats(bench):
    """The mooncake group's collective worker counters (ops, queued_us, run_us), or
    None for another backend."""
    try:
        from mooncake import pg
        return pg._lib._worker_stats(bench.group or bench.dist.group.WORLD)
    except Exception:  # noqa: BLE001 - gloo/nccl groups, or an older build
        return None


def measure(benches, ctrl, args, dist, torch):
    """Times every bench's run() in interleaved blocks (--rounds), so that the backends
    share the machine's conditions; returns {name: per-iteration times in us (slowest rank)},
    on CUDA {name: host time per op to issue it in us (slowest rank)}: an issue time
    close to the event time says the host, not the GPU, sets the pace; and for mooncake
    groups {name: (queued_us, run_us)}, the collective worker's mean host time per op
    (slowest rank), taken from the group's counters around the timed blocks."""
    plans = {name: plan_iters(b, ctrl, args, dist, torch) for name, b in benches.items()}
    local = {name: [] for name in benches}
    issue = {name: [] for name in benches}
    worker = {name: [0, 0.0, 0.0] for name in benches}  # ops, queued_us, run_us
    rounds = max(1, args.rounds)
    for k in range(rounds):
        for name, bench in benches.items():
            todo = plans[name] // rounds + (1 if k < plans[name] % rounds else 0)
            dist.barrier(group=bench.group)
            before = _worker_stats(bench)
            if args.device == "cuda":
                # nccl-tests: events around back-to-back ops; each op of the
                # block is charged the block's mean.
                if todo == 0:
                    continue
                sync(torch, args)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                t0 = time.perf_counter()
                for _ in range(todo):
                    bench.run()
                issued = time.perf_counter() - t0
                end.record()
                end.synchronize()
                ops = todo * getattr(bench, "ops_per_run", 1)
                local[name].extend([start.elapsed_time(end) * 1e-3 / ops] * todo)
                issue[name].extend([issued / ops] * todo)
            else:
                for _ in range(todo):
                    t0 = time.perf_counter()
                    bench.run()
                    local[name].append(time.perf_counter() - t0)
            after = _worker_stats(bench)
            if before is not None and after is not None:
                for i, key in enumerate(("ops", "queued_us", "run_us")):
                    worker[name][i] += after[key] - before[key]
    def slowest(per_name):
        out = {}
        for name, ts in per_name.items():
            t = torch.tensor(ts, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
            out[name] = (t * 1e6).tolist()
        return out
    per_op = {}
    for name in benches:
        ops, queued, run = worker[name]
        mine = torch.tensor([queued / ops, run / ops] if ops else [-1.0, -1.0], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=ctrl)
        if mine[1] >= 0:
            per_op[name] = (mine[0].item(), mine[1].item())
    return slowest(local), (slowest(issue) if args.device == "cuda" else {}), per_op


def memcpy_rows(torch, sizes_bytes, args):
    """Single-thread memcpy (libc memmove through ctypes) of every size between two
    distinct, pre-faulted buffers: median time per copy, and GB/s = size / time. Each
    timed sample covers enough copies to last about 20 us, so the clock and the Python
    call do not dominate small sizes."""
    import ctypes
    out = []
    for size in sizes_bytes:
        src_t = torch.ones(max(1, size), dtype=torch.uint8)
        dst_t = torch.zeros_like(src_t)
        src, dst, n = src_t.data_ptr(), dst_t.data_ptr(), src_t.numel()
        copy = lambda: ctypes.memmove(dst, src, n)  # noqa: E731
        reps = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(reps):
                copy()
            if time.perf_counter() - t0 >= 20e-6 or reps >= 1 << 16:
                break
            reps *= 2
        samples = []
        budget_end = time.perf_counter() + max(args.time_budget, 0.2)
        for i in range(max(args.iters, 5)):
            t0 = time.perf_counter()
            for _ in range(reps):
                copy()
            samples.append((time.perf_counter() - t0) / reps * 1e6)
            if i >= 4 and time.perf_counter() > budget_end:
                break
        med = statistics.median(samples)
        out.append({"backend": "memcpy", "collective": "memcpy", "size": size, "count": size,
                    "type": "uint8", "op": None, "nranks": 1, "iters": len(samples),
                    "time_us_median": med, "time_us_p99": percentile(samples, 99),
                    "time_us_mean": statistics.fmean(samples), "algbw_GBps": size / (med * 1e-6) / 1e9,
                    "busbw_GBps": size / (med * 1e-6) / 1e9, "check": "n/a", "engine": None})
    return out


def _copy_row(torch, name, dst, src, bytes_moved, args):
    """A row for dst.copy_(src), timed with CUDA events on the current stream after
    three untimed copies; GB/s is `bytes_moved` per copy."""
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(src.device)
    torch.cuda.synchronize(dst.device)
    samples = []
    for _ in range(max(5, min(args.iters, 20))):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    med = statistics.median(samples)
    gbps = bytes_moved / (med * 1e-6) / 1e9
    return {"backend": name, "collective": name, "size": src.numel(), "count": src.numel(),
            "type": "uint8", "op": None, "nranks": 1, "iters": len(samples), "time_us_median": med,
            "time_us_p99": percentile(samples, 99), "time_us_mean": statistics.fmean(samples),
            "algbw_GBps": gbps, "busbw_GBps": gbps, "check": "n/a", "engine": None}


def device_copy_row(torch, size, args):
    """Device-to-device copy of `size` bytes on rank 0, timed with CUDA events; GB/s
    counts reads and writes (2 x size), the unit of the traffic limit."""
    src = torch.ones(max(1, size), dtype=torch.uint8, device="cuda")
    return _copy_row(torch, "device_copy", torch.zeros_like(src), src, 2 * src.numel(), args)


def link_copy_row(torch, size, args):
    """A copy of `size` bytes from GPU 0 to GPU 1 on rank 0, timed on GPU 0's stream;
    GB/s counts the bytes once (what one link carries one way)."""
    with torch.cuda.device(0):
        src = torch.ones(max(1, size), dtype=torch.uint8, device="cuda:0")
        dst = torch.zeros(max(1, size), dtype=torch.uint8, device="cuda:1")
        return _copy_row(torch, "link_copy", dst, src, src.numel(), args)


def link_fractions(rows):
    """busbw over the GPU 0 -> GPU 1 copy bandwidth of the same run, for every row."""
    copy = [r for r in rows if r["collective"] == "link_copy"]
    if not copy:
        return []
    gbps = copy[0]["busbw_GBps"]
    return [{"collective": r["collective"], "backend": r["backend"], "size": r["size"],
             "busbw_GBps": r["busbw_GBps"], "link_GBps": gbps, "busbw_over_link": r["busbw_GBps"] / gbps}
            for r in rows if r["collective"] != "link_copy"]


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


def traffic_bytes(coll, size, n):
    """HBM bytes an op must move at least (read every input, write every output);
    `size` is the benchmark's size (the larger side). None: no limit defined."""
    if coll == "all_reduce":
        return 2 * n * size
    if coll in ("all_gather", "reduce_scatter"):
        return (n + 1) * size
    if coll in ("all_to_all", "all_to_all_v", "sendrecv"):
        return 2 * n * size
    return None


def limit_fractions(rows):
    """Each row's limit time (traffic / device copy GB/s) over its measured time."""
    copy = [r for r in rows if r["collective"] == "device_copy"]
    if not copy:
        return []
    gbps = copy[0]["busbw_GBps"]
    out = []
    for r in rows:
        t = traffic_bytes(r["collective"], r["size"], r["nranks"])
        if t is None or r["collective"] == "device_copy":
            continue
        limit_us = t / (gbps * 1e9) * 1e6
        out.append({"collective": r["collective"], "backend": r["backend"], "size": r["size"],
                    "time_us": r["time_us_median"], "limit_us": limit_us, "copy_GBps": gbps,
                    "fraction_of_limit": limit_us / r["time_us_median"]})
    return out


def memcpy_ratios(rows):
    """busbw / single-thread memcpy GB/s for every measured row."""
    copy = {r["size"]: r["busbw_GBps"] for r in rows if r["collective"] == "memcpy"}
    out = []
    for r in rows:
        if r["collective"] == "memcpy" or r["size"] not in copy or not copy[r["size"]]:
            continue
        out.append({"collective": r["collective"], "backend": r["backend"], "size": r["size"],
                    "busbw_GBps": r["busbw_GBps"], "memcpy_GBps": copy[r["size"]],
                    "busbw_over_memcpy": r["busbw_GBps"] / copy[r["size"]]})
    return out


def percentile(values, p):
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(math.ceil(p / 100 * len(s))) - 1))
    return s[k]


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
                                                    else None)})
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


# --------------------------------------------------------------------------- output

def peer_of(rows):
    """The reference backend measured in `rows` (gloo or nccl), or None."""
    return next((b for b in PEERS if any(r["backend"] == b for r in rows)), None)


def ratios(rows):
    """mooncake over the peer backend of the same run, per collective and size."""
    peer = peer_of(rows)
    by = {}
    for row in rows:
        by[(row["collective"], row["size"], row["backend"])] = row
    out = []
    for (coll, size, b), row in by.items():
        if b not in (MOONCAKE, MOONCAKE_CUDA) or (coll, size, peer) not in by:
            continue
        g = by[(coll, size, peer)]
        out.append({"collective": coll, "size": size, "peer": peer,
                    "busbw_ratio": row["busbw_GBps"] / g["busbw_GBps"] if g["busbw_GBps"] else None,
                    "latency_ratio": row["time_us_median"] / g["time_us_median"] if g["time_us_median"] else None,
                    "latency_ratio_p99": row["time_us_p99"] / g["time_us_p99"] if g["time_us_p99"] else None})
    return out


def print_tables(rows, rats, args, n):
    print(f"# pgbench  nranks={n} device={args.device} dtype={args.dtype} op={args.op} "
          f"iters<={args.iters} warmup={args.warmup} sizes={args.minbytes}..{args.maxbytes} x{args.stepfactor}")
    for coll in dict.fromkeys(r["collective"] for r in rows
                              if r["collective"] not in ("memcpy", "device_copy", "link_copy")):
        for b in dict.fromkeys(r["backend"] for r in rows):
            sel = [r for r in rows if r["collective"] == coll and r["backend"] == b]
            if not sel:
                continue
            print(f"#\n# collective={coll} backend={b}  (busbw factor {bus_factor(coll, n):.3f})")
            cuda = args.device == "cuda"
            print(f"# {'size':>12} {'count':>12} {'type':>8} {'time_us':>11} {'p99_us':>11} "
                  f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'iters':>6} {'check':>7}"
                  + (f" {'issue_us':>9} {'worker_us':>9}" if cuda else ""))
            for r in sel:
                print(f"  {r['size']:>12} {r['count']:>12} {r['type']:>8} {r['time_us_median']:>11.2f} "
                      f"{r['time_us_p99']:>11.2f} {r['algbw_GBps']:>12.3f} {r['busbw_GBps']:>12.3f} "
                      f"{r['iters']:>6} {r['check']:>7}"
                      + (f" {r['issue_us_median']:>9.2f} {_fmt_opt(r['worker_run_us_mean']):>9}"
                         if cuda else ""))
        sel = [x for x in rats if x["collective"] == coll]
        if sel:
            print(f"#\n# collective={coll} ratio {mooncake_name(args.device)} / {sel[0]['peer']}  "
                  "(busbw: higher is better; latency: lower is better)")
            print(f"# {'size':>12} {'busbw_ratio':>12} {'lat_ratio':>10} {'p99_ratio':>10}")
            for x in sel:
                f = lambda v: f"{v:.2f}" if v is not None else "n/a"  # noqa: E731
                print(f"  {x['size']:>12} {f(x['busbw_ratio']):>12} {f(x['latency_ratio']):>10} "
                      f"{f(x['latency_ratio_p99']):>10}")
    mrat = memcpy_ratios(rows)
    if mrat:
        backends = list(dict.fromkeys(x["backend"] for x in mrat))
        copy = {r["size"]: r for r in rows if r["collective"] == "memcpy"}
        for coll in dict.fromkeys(x["collective"] for x in mrat):
            print(f"#\n# collective={coll} busbw / single-thread memcpy (rank 0, same run)")
            head = "".join(f" {b + ' busbw':>18} {'ratio':>6}" for b in backends)
            print(f"# {'size':>12} {'memcpy(GB/s)':>13}{head}")
            for size in sorted({x["size"] for x in mrat if x["collective"] == coll}):
                cells = ""
                for b in backends:
                    m = [x for x in mrat if x["collective"] == coll and x["backend"] == b and x["size"] == size]
                    cells += (f" {m[0]['busbw_GBps']:>18.3f} {m[0]['busbw_over_memcpy']:>6.2f}" if m
                              else f" {'n/a':>18} {'n/a':>6}")
                print(f"  {size:>12} {copy[size]['busbw_GBps']:>13.3f}{cells}")
    fracs = limit_fractions(rows)
    if fracs:
        print(f"#\n# fraction of the HBM traffic limit (device copy {fracs[0]['copy_GBps']:.0f} GB/s "
              "read+write, same run; 1.0 = the limit)")
        print(f"# {'collective':>14} {'backend':>14} {'size':>12} {'time_us':>11} {'limit_us':>10} {'fraction':>9}")
        for x in fracs:
            print(f"  {x['collective']:>14} {x['backend']:>14} {x['size']:>12} {x['time_us']:>11.2f} "
                  f"{x['limit_us']:>10.2f} {x['fraction_of_limit']:>9.4f}")
    links = link_fractions(rows)
    if links:
        print(f"#\n# busbw over the GPU 0 -> GPU 1 copy ({links[0]['link_GBps']:.0f} GB/s one way, same run)")
        print(f"# {'collective':>14} {'backend':>14} {'size':>12} {'busbw(GB/s)':>12} {'fraction':>9}")
        for x in links:
            print(f"  {x['collective']:>14} {x['backend']:>14} {x['size']:>12} {x['busbw_GBps']:>12.3f} "
                  f"{x['busbw_over_link']:>9.4f}")
    bad = [r for r in rows if r["check"] == "FAILED"]
    if bad:
        print(f"# WARNING: {len(bad)} row(s) failed the correctness check: "
              + ", ".join(f"{r['backend']} {r['collective']} {r['size']} B" for r in bad))


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
                       "link_fractions": link_fractions(rows)},
                      f, indent=1)
    return 1 if any(r["check"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
