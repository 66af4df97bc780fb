"""The `mooncake` backend on CUDA tensors: N processes sharing one GPU.

Every collective and P2P op on CUDA tensors against a reference computed in
Python from the ranks' known inputs, at 2 and 4 processes; stream semantics (a
producer kernel on the caller's current stream, then the op, then a consumer,
with no explicit synchronization); bad input. Each runs under both data paths
(MC_PG_CUDA_PATH): `staged` (through the host) and `kernels` (the device
collectives, also with small window slots so every message runs in many
chunks); on the kernel path the collectives it covers must have run on the
device. The kernel path's own cases (queued calls, the direct path, list and
coalesced forms, root mismatches) are in test_cuda_kernels.py, a failed rank
in test_cuda_failures.py. Skipped, with the reason shown, on a machine
without a GPU.
"""

import pytest
import torch
import torch.distributed as dist

import harness

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine: the `mooncake` CUDA tests need a GPU",
                allow_module_level=True)

from cuda_common import (BACKEND, JOB_TIMEOUT_S, OP_TIMEOUT_S, PATHS, _device_calls, _direct_calls,
                         use_rank_gpu, world_sizes)

# Small values: sums, products and averages are exact in every dtype below.
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64,
          torch.int8, torch.uint8)


def _base(rank, n, dtype):
    """Rank `rank`'s input: small integers, different per rank and per element."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3) % 11 + 1
    return v.to(dtype)


def _ref_reduce(ws, n, dtype, op):
    xs = [_base(r, n, dtype).to(torch.float64) for r in range(ws)]
    if op == "SUM":
        out = sum(xs)
    elif op == "MAX":
        out = torch.stack(xs).max(0).values
    elif op == "MIN":
        out = torch.stack(xs).min(0).values
    elif op == "PRODUCT":
        out = torch.stack([(x % 2) + 1 for x in xs]).prod(0)
    else:  # AVG
        out = sum(xs) / ws
    return out.to(dtype)


class Checks:
    def __init__(self, ctx):
        self.ctx = ctx
        self.failures = []
        self.raised = False

    def eq(self, name, got, want):
        got = got.cpu()
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            self.failures.append(f"rank {self.ctx.rank}: {name}: got {got.flatten()[:8].tolist()} "
                                 f"{got.dtype} {tuple(got.shape)}, expected "
                                 f"{want.flatten()[:8].tolist()} {want.dtype} {tuple(want.shape)}")

    def run(self, name, fn):
        if self.raised:
            # The ranks may be out of step after an exception: the first one
            # is the finding, later ones would only be its echoes.
            return
        self.ctx.note(name)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - reported per check
            self.raised = True
            self.failures.append(f"rank {self.ctx.rank}: {name} raised {type(e).__name__}: {e}")


def _values(ctx):
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    c = Checks(ctx)
    n = 37

    def x_of(r, dtype, m=n):
        return _base(r, m, dtype).to(dev)

    for dtype in DTYPES:
        ops = ["SUM", "MAX", "MIN"] + (["AVG", "PRODUCT"] if dtype.is_floating_point else [])
        for op in ops:
            def all_reduce(dtype=dtype, op=op):
                t = x_of(rank, dtype)
                if op == "PRODUCT":
                    t = (t.to(torch.int64) % 2 + 1).to(dtype)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                c.eq(f"all_reduce {op} {dtype}", t, _ref_reduce(ws, n, dtype, op))
            c.run(f"all_reduce {op} {dtype}", all_reduce)

    def premul_sum():
        # FSDP's gradient scaling: inputs times the factor, then SUM (all_reduce
        # and reduce_scatter_tensor take the device kernels on that path).
        for factor in (0.5, torch.tensor(3.0, device=dev)):
            f = float(factor)
            for dtype in (torch.float32, torch.bfloat16):
                t = x_of(rank, dtype)
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
                want = sum(_base(r, n, dtype).double() * f for r in range(ws)).to(dtype)
                c.eq(f"all_reduce PREMUL_SUM {dtype} factor {f}", t, want)
                inp = torch.cat([x_of(rank + 10 * p, dtype) for p in range(ws)])
                got = torch.zeros(n, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(got, inp, op=dist._make_nccl_premul_sum(factor))
                want = sum(_base(r + 10 * rank, n, dtype).double() * f for r in range(ws)).to(dtype)
                c.eq(f"reduce_scatter_tensor PREMUL_SUM {dtype} factor {f}", got, want)
    c.run("premul_sum", premul_sum)

    def non_contiguous():
        base = torch.stack([x_of(rank, torch.float32), x_of(rank, torch.float32)], 1)  # [n, 2]
        view = base[:, 1]  # stride 2
        dist.all_reduce(view)
        c.eq("all_reduce non-contiguous view", view, _ref_reduce(ws, n, torch.float32, "SUM"))
        c.eq("all_reduce non-contiguous: the other column is untouched", base[:, 0],
             _base(rank, n, torch.float32))
    c.run("non_contiguous", non_contiguous)

    def large():
        m = 6 << 20  # 24 MiB of float32: several core chunks
        t = x_of(rank, torch.float32, m)
        dist.all_reduce(t)
        c.eq("all_reduce 24 MiB", t, _ref_reduce(ws, m, torch.float32, "SUM"))
        # Around the kernels' one-shot/two-shot switch (1 MiB) and odd tails.
        for m in ((1 << 18) - 1, 1 << 18, (1 << 18) + 5, 3 * (1 << 18) + 7):
            t = x_of(rank, torch.float32, m)
            dist.all_reduce(t)
            c.eq(f"all_reduce {m} floats", t, _ref_reduce(ws, m, torch.float32, "SUM"))
        m = (5 << 20) + 3  # bf16, 10 MiB and a tail: chunked movers
        out = torch.zeros(ws * m, dtype=torch.bfloat16, device=dev)
        dist.all_gather_into_tensor(out, x_of(rank, torch.bfloat16, m))
        c.eq("all_gather_into_tensor 10 MiB", out,
             torch.cat([_base(r, m, torch.bfloat16) for r in range(ws)]))
        inp = torch.cat([x_of(rank + 10 * p, torch.float32, m) for p in range(ws)])
        got = torch.zeros(m, device=dev)
        dist.reduce_scatter_tensor(got, inp, op=dist.ReduceOp.MAX)
        want = torch.stack([_base(r + 10 * rank, m, torch.float32) for r in range(ws)]).max(0).values
        c.eq("reduce_scatter_tensor MAX 20 MiB", got, want)
        inp = torch.cat([x_of(rank * 10 + p, torch.int32, m) for p in range(ws)])
        got = torch.zeros(ws * m, dtype=torch.int32, device=dev)
        dist.all_to_all_single(got, inp)
        c.eq("all_to_all_single 20 MiB", got,
             torch.cat([_base(p * 10 + rank, m, torch.int32) for p in range(ws)]))
        t = x_of(rank, torch.float16, m)
        dist.broadcast(t, src=ws - 1)
        c.eq("broadcast 10 MiB", t, _base(ws - 1, m, torch.float16))
    c.run("large", large)

    for root in (0, ws - 1):
        def broadcast(root=root):
            t = x_of(rank, torch.bfloat16)
            dist.broadcast(t, src=root)
            c.eq(f"broadcast root {root}", t, _base(root, n, torch.bfloat16))
        c.run(f"broadcast {root}", broadcast)

        def reduce(root=root):
            t = x_of(rank, torch.int64)
            dist.reduce(t, dst=root)
            want = _ref_reduce(ws, n, torch.int64, "SUM") if rank == root else _base(rank, n, torch.int64)
            c.eq(f"reduce root {root}", t, want)
        c.run(f"reduce {root}", reduce)

        def gather(root=root):
            outs = [torch.zeros(n, dtype=torch.float16, device=dev) for _ in range(ws)] if rank == root else None
            dist.gather(x_of(rank, torch.float16), gather_list=outs, dst=root)
            if rank == root:
                for r in range(ws):
                    c.eq(f"gather root {root} [{r}]", outs[r], _base(r, n, torch.float16))
        c.run(f"gather {root}", gather)

        def scatter(root=root):
            out = torch.zeros(n, dtype=torch.int32, device=dev)
            ins = [x_of(r * 5, torch.int32) for r in range(ws)] if rank == root else None
            dist.scatter(out, scatter_list=ins, src=root)
            c.eq(f"scatter root {root}", out, _base(rank * 5, n, torch.int32))
        c.run(f"scatter {root}", scatter)

    def all_gather():
        outs = [torch.zeros(n, device=dev) for _ in range(ws)]
        dist.all_gather(outs, x_of(rank, torch.float32))
        for r in range(ws):
            c.eq(f"all_gather [{r}]", outs[r], _base(r, n, torch.float32))
    c.run("all_gather", all_gather)

    def all_gather_into_tensor():
        out = torch.zeros(ws * n, dtype=torch.bfloat16, device=dev)
        dist.all_gather_into_tensor(out, x_of(rank, torch.bfloat16))
        c.eq("all_gather_into_tensor", out, torch.cat([_base(r, n, torch.bfloat16) for r in range(ws)]))
        # In place (FSDP): the input is this rank's block of the output.
        out2 = torch.zeros(ws * n, dtype=torch.float32, device=dev)
        out2[rank * n:(rank + 1) * n] = x_of(rank, torch.float32)
        dist.all_gather_into_tensor(out2, out2[rank * n:(rank + 1) * n])
        c.eq("all_gather_into_tensor in place", out2,
             torch.cat([_base(r, n, torch.float32) for r in range(ws)]))
    c.run("all_gather_into_tensor", all_gather_into_tensor)

    def reduce_scatter():
        out = torch.zeros(n, device=dev)
        dist.reduce_scatter(out, [x_of(rank + 10 * p, torch.float32) for p in range(ws)])
        want = sum(_base(r + 10 * rank, n, torch.float64) for r in range(ws)).to(torch.float32)
        c.eq("reduce_scatter", out, want)
    c.run("reduce_scatter", reduce_scatter)

    def reduce_scatter_tensor():
        inp = torch.cat([x_of(rank + 10 * p, torch.int64) for p in range(ws)])
        out = torch.zeros(n, dtype=torch.int64, device=dev)
        dist.reduce_scatter_tensor(out, inp)
        want = sum(_base(r + 10 * rank, n, torch.int64) for r in range(ws))
        c.eq("reduce_scatter_tensor", out, want)
    c.run("reduce_scatter_tensor", reduce_scatter_tensor)

    def all_to_all_single():
        inp = torch.cat([x_of(rank * 10 + p, torch.float32) for p in range(ws)])
        out = torch.zeros(ws * n, device=dev)
        dist.all_to_all_single(out, inp)
        c.eq("all_to_all_single", out, torch.cat([_base(p * 10 + rank, n, torch.float32) for p in range(ws)]))
        # Uneven: rank r sends p + 1 rows to rank p.
        send = [p + 1 for p in range(ws)]
        recv = [rank + 1] * ws
        rows = torch.cat([torch.full((p + 1, 3), float(rank * 100 + p)) for p in range(ws)]).to(dev)
        got = torch.zeros(sum(recv), 3, device=dev)
        dist.all_to_all_single(got, rows, output_split_sizes=recv, input_split_sizes=send)
        want = torch.cat([torch.full((rank + 1, 3), float(p * 100 + rank)) for p in range(ws)])
        c.eq("all_to_all_single uneven", got, want)
        # Uneven overall although rank 0's own splits are all one row (ranks
        # above 0 send themselves two): every rank must take the same path.
        def rows_of(src, dst):
            return 2 if src == dst and src > 0 else 1
        send = [rows_of(rank, p) for p in range(ws)]
        recv = [rows_of(p, rank) for p in range(ws)]
        rows = torch.cat([torch.full((rows_of(rank, p), 3), float(rank * 100 + p)) for p in range(ws)])
        got = torch.zeros(sum(recv), 3, device=dev)
        dist.all_to_all_single(got, rows.to(dev), output_split_sizes=recv, input_split_sizes=send)
        want = torch.cat([torch.full((rows_of(p, rank), 3), float(p * 100 + rank)) for p in range(ws)])
        c.eq("all_to_all_single uneven, rank 0 balanced", got, want)
    c.run("all_to_all_single", all_to_all_single)

    def all_to_all():
        ins = [x_of(rank * 10 + p, torch.int32) for p in range(ws)]
        outs = [torch.zeros(n, dtype=torch.int32, device=dev) for _ in range(ws)]
        dist.all_to_all(outs, ins)
        for p in range(ws):
            c.eq(f"all_to_all [{p}]", outs[p], _base(p * 10 + rank, n, torch.int32))
    c.run("all_to_all", all_to_all)

    c.run("barrier", lambda: dist.barrier())

    def p2p():
        right, left = (rank + 1) % ws, (rank - 1) % ws
        got = torch.zeros(n, device=dev)
        reqs = [dist.isend(x_of(rank, torch.float32), right), dist.irecv(got, left)]
        for r in reqs:
            r.wait()
        c.eq("isend/irecv ring", got, _base(left, n, torch.float32))
        got2 = torch.zeros(n, dtype=torch.bfloat16, device=dev)
        ops = [dist.P2POp(dist.isend, x_of(rank + 20, torch.bfloat16), right),
               dist.P2POp(dist.irecv, got2, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.eq("batch_isend_irecv ring", got2, _base(left + 20, n, torch.bfloat16))
    c.run("p2p", p2p)

    def functional():
        import torch.distributed._functional_collectives as funcol
        t = funcol.all_reduce(x_of(rank, torch.float32), "sum", dist.group.WORLD)
        c.eq("funcol.all_reduce", funcol.wait_tensor(t), _ref_reduce(ws, n, torch.float32, "SUM"))
    c.run("functional", functional)

    def async_wait_then_future():
        t = x_of(rank, torch.float32)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        work.wait()
        c.eq("async all_reduce after wait()", t, _ref_reduce(ws, n, torch.float32, "SUM"))
        c.eq("get_future().value()", fut.value()[0], _ref_reduce(ws, n, torch.float32, "SUM"))
        work.synchronize()
        if not work.is_completed():
            c.failures.append(f"rank {rank}: is_completed() is False after synchronize()")
    c.run("async", async_wait_then_future)

    # A CPU op on the same `mooncake` group still works (object collectives use it).
    def cpu_on_mooncake():
        objs = [None] * ws
        dist.all_gather_object(objs, {"rank": rank})
        if objs != [{"rank": r} for r in range(ws)]:
            c.failures.append(f"rank {rank}: all_gather_object gave {objs}")
    c.run("cpu on mooncake", cpu_on_mooncake)
    return {"failures": c.failures, "device_calls": _device_calls(), "direct_calls": _direct_calls()}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("world_size", world_sizes(2, 4))
def test_collective_values_on_cuda(world_size, path):
    # Each op must finish within OP_TIMEOUT_S: a stuck one fails with the
    # stage it was stuck in (staging copies, a peer that never arrived, ...).
    res = harness.run_ranks(_values, world_size, BACKEND, timeout_s=JOB_TIMEOUT_S, ref_group=False,
                            env=PATHS[path], pg_timeout_s=OP_TIMEOUT_S)
    failures = [f for per_rank in res for f in per_rank["failures"]]
    assert not failures, "\n".join(failures[:40])
    calls = [r["device_calls"] for r in res]
    if path == "staged":
        assert calls == [0] * world_size, f"staged path ran device kernels: {calls}"
    else:
        # all_reduce (every dtype and op, large, funcol, async), broadcast x2,
        # all_gather_into_tensor x3, reduce_scatter_tensor x2, all_to_all_single x2
        # at least; every rank the same.
        assert len(set(calls)) == 1 and calls[0] >= 40, f"kernel path device calls: {calls}"
        # The 24 MiB all_reduce read the members' buffers directly, unless
        # the direct path is off.
        direct = [r["direct_calls"] for r in res]
        if PATHS[path].get("MC_PG_CUDA_DIRECT") == "0":
            assert direct == [0] * world_size, f"direct path calls with it off: {direct}"
        else:
            assert len(set(direct)) == 1 and direct[0] >= 1, f"direct path calls: {direct}"


# Long enough that an op which did not wait for the producer reads zeros.
SLEEP_CYCLES = 400_000_000


def _stream_semantics(ctx):
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    out = []
    want = float(sum(r + 1 for r in range(ws)))
    # async_op=False: the kernels go on the caller's stream itself (pg-cuda.md).
    for side, sync in ((False, False), (True, False), (False, True), (True, True)):
        stream = torch.cuda.Stream() if side else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            x = torch.zeros(1 << 16, device=dev)
            torch.cuda._sleep(SLEEP_CYCLES)  # producer: a slow kernel, then the fill
            x.fill_(rank + 1)
            if sync:
                dist.all_reduce(x)
            else:
                dist.all_reduce(x, async_op=True).wait()
            y = x * 2  # consumer, queued on the same stream right after the op
            out.append((side, float(y.min().item()), float(y.max().item())))
    # P2P: the send's data is written by a slow producer; the recv's consumer follows wait().
    if ws >= 2:
        with torch.cuda.stream(torch.cuda.Stream()):
            t = torch.zeros(1 << 16, device=dev)
            if rank == 0:
                torch.cuda._sleep(SLEEP_CYCLES)
                t.fill_(42)
                dist.send(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                z = t + 1
                out.append(("p2p", float(z.min().item()), float(z.max().item())))
    failures = []
    for side, lo, hi in out:
        expect = 43.0 if side == "p2p" else 2 * want
        if lo != expect or hi != expect:
            failures.append(f"rank {rank} ({'side stream' if side is True else side or 'current'}): "
                            f"consumer saw [{lo}, {hi}], expected {expect}")
    return failures


@pytest.mark.parametrize("path", ["staged", "kernels"])
@pytest.mark.parametrize("world_size", [2])
def test_stream_semantics(world_size, path):
    res = harness.run_ranks(_stream_semantics, world_size, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS[path])
    failures = [f for per_rank in res for f in per_rank]
    assert not failures, "\n".join(failures)


def _isend_before_its_data_is_produced(ctx):
    """isend of a CUDA tensor whose producer is still running: the call
    returns while the producer runs (the copy to the host mirror is awaited
    on the group's poster thread, not the caller's), a recv posted after it
    on the same rank is not held up, and the receiver gets the produced
    values. Rank 0 sends to 1 and then receives from 1."""
    dev = use_rank_gpu(ctx.rank)
    rank = ctx.rank
    n = 1 << 16
    if rank == 0:
        x = torch.zeros(n, device=dev)
        torch.cuda._sleep(SLEEP_CYCLES)  # a slow producer ...
        x.fill_(7.0)  # ... of the data sent
        produced = torch.cuda.Event()
        produced.record()
        send = dist.isend(x, 1)
        returned_while_producing = not produced.query()
        back = torch.zeros(n, device=dev)
        dist.irecv(back, 1).wait()
        send.wait()
        torch.cuda.synchronize()
        return {"returned_while_producing": returned_while_producing,
                "values": [float(back.min()), float(back.max())]}
    got = torch.zeros(n, device=dev)
    dist.recv(got, 0)
    dist.send(got + 1, 0)
    torch.cuda.synchronize()
    return {"values": [float(got.min()), float(got.max())]}


def test_isend_returns_before_its_producer_finishes():
    res = harness.run_ranks(_isend_before_its_data_is_produced, 2, BACKEND,
                            timeout_s=JOB_TIMEOUT_S, ref_group=False)
    assert res[1]["values"] == [7.0, 7.0], res
    assert res[0]["values"] == [8.0, 8.0], res
    assert res[0]["returned_while_producing"], (
        "isend blocked its caller until the slow producer of its data finished")


def _recv_behind_a_slow_kernel(ctx):
    """irecv into a CUDA tensor while a slow kernel still runs on the caller's
    stream, the sender sending at once: the data arrives in the recv's host
    mirror long before the kernel ends, and nothing queued behind that kernel
    (a copy of the tensor's old values, say) may overwrite it. The tensor
    ends with exactly what was sent, after the kernel's own write to another
    tensor."""
    dev = use_rank_gpu(ctx.rank)
    n = 1 << 20
    if ctx.rank == 1:
        dist.send(torch.arange(n, dtype=torch.float32, device=dev), 0)
        torch.cuda.synchronize()
        return {}
    y = torch.full((n,), -1.0, device=dev)
    marker = torch.zeros(1, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)  # the slow kernel ...
    marker.fill_(1.0)  # ... and its output
    dist.irecv(y, 1).wait()
    torch.cuda.synchronize()
    want = torch.arange(n, dtype=torch.float32)
    return {"exact": bool(torch.equal(y.cpu(), want)), "marker": float(marker.item()),
            "old_values_left": int((y == -1.0).sum())}


def test_a_recv_behind_a_slow_kernel_keeps_the_data_it_received():
    res = harness.run_ranks(_recv_behind_a_slow_kernel, 2, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False)
    assert res[0]["marker"] == 1.0, res
    assert res[0]["exact"] and res[0]["old_values_left"] == 0, res


def _calls_across_streams(ctx):
    """Asynchronous calls (the group's stream) and synchronous ones (their
    caller's stream: the current one or either of two side streams)
    interleaved, sizes differing per call and every fifth call on the direct
    path: the device runs the group's calls in call order whatever stream
    each went on, so every result is exact."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    sides = (torch.cuda.Stream(), torch.cuda.Stream())
    pending, done = [], []
    for i in range(30):
        n = (1 << 20) + i if i % 5 == 0 else 1000 + i  # 4 MiB and up: the direct path
        t = torch.full((n,), float(rank + i), device=dev)
        kind = i % 4
        if kind == 0:
            pending.append((dist.all_reduce(t, async_op=True), t, i))
        elif kind == 1:
            dist.all_reduce(t)  # on the current stream
            done.append((t, i))
        else:
            side = sides[kind - 2]
            side.wait_stream(torch.cuda.current_stream())  # t's fill
            with torch.cuda.stream(side):
                dist.all_reduce(t)
            done.append((t, i))
    for work, t, i in pending:
        work.wait()
        done.append((t, i))
    torch.cuda.synchronize()
    failures = []
    for t, i in done:
        want = float(ws * i + ws * (ws - 1) // 2)
        lo, hi = float(t.min().item()), float(t.max().item())
        if lo != want or hi != want:
            failures.append(f"rank {rank} call {i}: [{lo}, {hi}], expected {want}")
    return {"failures": failures, "device_calls": _device_calls()}


@pytest.mark.parametrize("world_size", world_sizes(2, 3))
def test_calls_on_several_streams_run_in_call_order(world_size):
    res = harness.run_ranks(_calls_across_streams, world_size, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"][:10])
        assert r["device_calls"] >= 30, (rank, r)


def _bad_input(ctx):
    dev = use_rank_gpu(ctx.rank)
    results = {}

    def outcome(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return None

    results["mixed_devices"] = outcome(lambda: dist.all_gather_into_tensor(
        torch.zeros(2 * ctx.world_size), torch.ones(2, device=dev)))
    cpu_group = dist.new_group(backend="mooncake-cpu")
    results["cuda_on_mooncake_cpu"] = outcome(lambda: dist.all_reduce(torch.ones(2, device=dev),
                                                                      group=cpu_group))
    results["mixed_list"] = outcome(lambda: dist.all_gather(
        [torch.zeros(2, device=dev)] + [torch.zeros(2) for _ in range(ctx.world_size - 1)],
        torch.ones(2, device=dev)))
    # The group still works afterwards.
    t = torch.full((3,), float(ctx.rank), device=dev)
    dist.all_reduce(t)
    results["after"] = t.cpu().tolist()
    dist.destroy_process_group(cpu_group)
    return results


def test_bad_input_on_cuda():
    ws = 2
    res = harness.run_ranks(_bad_input, ws, BACKEND, timeout_s=JOB_TIMEOUT_S, ref_group=False)
    for rank, r in enumerate(res):
        assert r["mixed_devices"] and "same device" in r["mixed_devices"], (rank, r)
        assert r["mixed_devices"].find("cpu") >= 0 and r["mixed_devices"].find("cuda") >= 0, (rank, r)
        assert r["cuda_on_mooncake_cpu"] and "mooncake-cpu" in r["cuda_on_mooncake_cpu"], (rank, r)
        assert r["mixed_list"] and "same device" in r["mixed_list"], (rank, r)
        assert r["after"] == [1.0, 1.0, 1.0], (rank, r)

