"""pgbench's measurements on one rank, imported by pgbench.py: the collectives,
backends and dtypes it knows, the sizes and element counts, Bench and GraphBench
(buffers, the op and its correctness check), the timed blocks (measure), and the
yardsticks timed on rank 0 (single-thread memcpy, device copy, GPU-to-GPU link copy)."""

import math
import statistics
import time

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "reduce",
               "gather", "scatter", "sendrecv")
MOONCAKE = "mooncake-cpu"
MOONCAKE_CUDA = "mooncake"
MOONCAKE_GRAPH = "mooncake-graph"
# What the mooncake backend can capture in a CUDA graph (docs/pg-user-guide.md).
GRAPH_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


# A bare CUDA op issued as the collectives are (Python, torch's dispatch, one kernel launch) and timed
# the same way, in every rank at once: the host's floor per op on this machine (--device cuda).
LAUNCH_FLOOR = "cuda-launch"

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


class LaunchFloorBench:
    """run() adds 1 in place to a tensor of `count` elements on the current GPU: one kernel, no
    communication. `group` only lines the ranks up between timed blocks."""

    ops_per_run = 1

    def __init__(self, torch, dist, count, dtype, group):
        self.torch, self.dist, self.group = torch, dist, group
        self.buf = torch.zeros(count, dtype=dtype, device="cuda")

    def run(self):
        self.buf.add_(1)

    def check(self):
        self.buf.fill_(3)
        self.run()
        return _expect(self.torch, self.buf, self.torch.full_like(self.buf, 4))


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
    groups {name: (queued_us, run_us, caller_fraction)}, the collective worker's mean host
    time per op (slowest rank; None where the worker ran no op) and the share of the ops the
    calling thread launched itself (MC_PG_CUDA_CALLER_LAUNCH; the smallest rank's), taken
    from the group's counters around the timed blocks."""
    plans = {name: plan_iters(b, ctrl, args, dist, torch) for name, b in benches.items()}
    local = {name: [] for name in benches}
    issue = {name: [] for name in benches}
    # ops, queued_us, run_us, caller_launched
    worker = {name: [0, 0.0, 0.0, 0] for name in benches}
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
                for i, key in enumerate(("ops", "queued_us", "run_us", "caller_launched")):
                    worker[name][i] += after.get(key, 0) - before.get(key, 0)
    def slowest(per_name):
        out = {}
        for name, ts in per_name.items():
            t = torch.tensor(ts, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
            out[name] = (t * 1e6).tolist()
        return out
    per_op = {}
    for name in benches:
        ops, queued, run, caller = worker[name]
        # The caller's share goes negated, so that MAX gives the smallest.
        mine = torch.tensor([queued / ops if ops else -1.0, run / ops if ops else -1.0,
                             -caller / (ops + caller) if ops + caller else 1.0],
                            dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=ctrl)
        if mine[1] >= 0 or mine[2] <= 0:
            per_op[name] = (mine[0].item() if mine[1] >= 0 else None,
                            mine[1].item() if mine[1] >= 0 else None,
                            -mine[2].item() if mine[2] <= 0 else None)
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


def percentile(values, p):
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(math.ceil(p / 100 * len(s))) - 1))
    return s[k]
