"""Every collective x op x dtype on the backend under test, against gloo, at 2, 3 and 4 ranks.

One spawned job per world size runs all checks (process start + torch import
costs seconds on a 2-core machine); each (world size, category) pair is then a
separate test item that reports the failures of its category. Each check runs
the same inputs through the backend under test (default group) and gloo
(`ctx.ref`) in the same process and also against a reference computed locally
in torch (pg_checks.Checker). Where gloo lacks an op/dtype (int16 everywhere,
AVG on integers, list all_to_all) the local torch reference is used instead.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import harness
from noncontig_checks import noncontiguous_checks
from pg_checks import (AVG_INT_REJECTION, DTYPES, Checker, kind_for, local_reduce, make,
                       reduce_cases, rop, short, summarize)

# Shared memory and TCP (MC_FORCE_TCP=1): see conftest.py.
pytestmark = pytest.mark.both_transports

WORLD_SIZES = (2, 3, 4)
JOB_TIMEOUT_S = 240

CATEGORIES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter",
    "all_reduce_coalesced", "all_gather_object", "broadcast_object_list", "functional",
    "zero_size", "views_and_noncontiguous", "medium_sizes", "premul_sum",
)
# The first functional collective costs seconds of lazy imports per process: one world size.
FUNCTIONAL_WORLD_SIZES = (2,)
CASES = [(c, w) for w in WORLD_SIZES for c in CATEGORIES
         if c != "functional" or w in FUNCTIONAL_WORLD_SIZES]


# --------------------------------------------------------------------------- operations
# Each takes the group first (None = default group = backend under test) and works on copies.

def _all_reduce(g, x, op):
    t = x.clone()
    dist.all_reduce(t, op=rop(op), group=g)
    return [t]


def _reduce(g, x, op, root, rank):
    t = x.clone()
    dist.reduce(t, dst=root, op=rop(op), group=g)
    return [t] if rank == root else None


def _broadcast(g, x, root):
    t = x.clone()
    dist.broadcast(t, src=root, group=g)
    return [t]


def _all_gather(g, x, ws):
    out = [torch.full_like(x, 0) for _ in range(ws)]
    dist.all_gather(out, x.clone(), group=g)
    return out


def _all_gather_into(g, x, ws, stacked):
    shape = (ws, *x.shape) if stacked else (ws * x.shape[0], *x.shape[1:])
    out = torch.zeros(shape, dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.clone(), group=g)
    return [out]


def _reduce_scatter(g, chunks, op):
    out = torch.zeros_like(chunks[0])
    dist.reduce_scatter(out, [c.clone() for c in chunks], op=rop(op), group=g)
    return [out]


def _reduce_scatter_tensor(g, x, op, ws, stacked):
    inp = x.clone().reshape(ws, -1) if stacked else x.clone()
    out = torch.zeros(x.shape[0] // ws, *x.shape[1:], dtype=x.dtype)
    dist.reduce_scatter_tensor(out, inp, op=rop(op), group=g)
    return [out]


def _all_to_all(g, ctx, inputs, out_shapes, dtype):
    outs = [torch.zeros(s, dtype=dtype) for s in out_shapes]
    if g is ctx.ref:
        # gloo has no list all_to_all: the gloo reference goes through all_to_all_single.
        flat_out = torch.zeros(sum(s[0] for s in out_shapes), *out_shapes[0][1:], dtype=dtype)
        dist.all_to_all_single(flat_out, torch.cat([t.clone() for t in inputs]),
                               output_split_sizes=[s[0] for s in out_shapes],
                               input_split_sizes=[t.shape[0] for t in inputs], group=g)
        return list(flat_out.split([s[0] for s in out_shapes]))
    dist.all_to_all(outs, [t.clone() for t in inputs], group=g)
    return outs


def _all_to_all_single(g, x, out_rows, in_splits, out_splits):
    out = torch.zeros(out_rows, *x.shape[1:], dtype=x.dtype)
    dist.all_to_all_single(out, x.clone(), output_split_sizes=out_splits,
                           input_split_sizes=in_splits, group=g)
    return [out]


def _gather(g, x, root, rank, ws):
    lst = [torch.zeros_like(x) for _ in range(ws)] if rank == root else None
    dist.gather(x.clone(), gather_list=lst, dst=root, group=g)
    return lst


def _scatter(g, chunks, root, rank, shape, dtype):
    out = torch.zeros(shape, dtype=dtype)
    dist.scatter(out, scatter_list=[c.clone() for c in chunks] if rank == root else None,
                 src=root, group=g)
    return [out]


# --------------------------------------------------------------------------- the job

def _collectives_worker(ctx):
    r, ws = ctx.rank, ctx.world_size
    ck = Checker(ctx)

    def inputs(key, shape, dtype, kind="sum"):
        return [make(key, q, shape, dtype, kind) for q in range(ws)]

    # all_reduce: every op x dtype, two shapes
    for op, dtype in reduce_cases():
        for shape in ((1,), (3, 33)):
            key = f"ar|{op}|{dtype}|{shape}"
            xs = inputs(key, shape, dtype, kind_for(op))
            avg_int = op == "AVG" and not dtype.is_floating_point
            ck.check("all_reduce", f"op={op} dtype={short(dtype)} shape={shape}",
                     lambda g: _all_reduce(g, xs[r], op), [local_reduce(xs, op, dtype)],
                     approx=op == "AVG", allow_error=AVG_INT_REJECTION if avg_int else None)

    # reduce: every op x dtype, first and last root
    for op, dtype in reduce_cases():
        for root in sorted({0, ws - 1}):
            key = f"red|{op}|{dtype}|{root}"
            xs = inputs(key, (5, 7), dtype, kind_for(op))
            avg_int = op == "AVG" and not dtype.is_floating_point
            ck.check("reduce", f"op={op} dtype={short(dtype)} root={root}",
                     lambda g: _reduce(g, xs[r], op, root, r),
                     [local_reduce(xs, op, dtype)] if r == root else None,
                     approx=op == "AVG", allow_error=AVG_INT_REJECTION if avg_int else None)

    # broadcast: every dtype, first and last root, 1-d and 3-d
    for dtype in DTYPES:
        for root in sorted({0, ws - 1}):
            for shape in ((17,), (2, 3, 5)):
                key = f"bc|{dtype}|{root}|{shape}"
                xs = inputs(key, shape, dtype, "full")
                ck.check("broadcast", f"dtype={short(dtype)} root={root} shape={shape}",
                         lambda g: _broadcast(g, xs[r], root), [xs[root]])

    # all_gather (list) and all_gather_into_tensor (concatenated and stacked output)
    for dtype in DTYPES:
        for shape in ((11,), (3, 4)):
            key = f"ag|{dtype}|{shape}"
            xs = inputs(key, shape, dtype, "full")
            ck.check("all_gather", f"dtype={short(dtype)} shape={shape}",
                     lambda g: _all_gather(g, xs[r], ws), xs)
            ck.check("all_gather_into_tensor", f"dtype={short(dtype)} shape={shape} concat",
                     lambda g: _all_gather_into(g, xs[r], ws, False), [torch.cat(xs)])
            ck.check("all_gather_into_tensor", f"dtype={short(dtype)} shape={shape} stacked",
                     lambda g: _all_gather_into(g, xs[r], ws, True), [torch.stack(xs)])

    # reduce_scatter (list) and reduce_scatter_tensor (flat and stacked input): every op x dtype
    n = 13
    for op, dtype in reduce_cases():
        key = f"rs|{op}|{dtype}"
        xs = inputs(key, (ws * n,), dtype, kind_for(op))
        want = [local_reduce([x[r * n:(r + 1) * n] for x in xs], op, dtype)]
        avg_int = op == "AVG" and not dtype.is_floating_point
        allow = AVG_INT_REJECTION if avg_int else None
        label = f"op={op} dtype={short(dtype)}"
        ck.check("reduce_scatter", label, lambda g: _reduce_scatter(g, list(xs[r].split(n)), op),
                 want, approx=op == "AVG", allow_error=allow)
        ck.check("reduce_scatter_tensor", label + " flat",
                 lambda g: _reduce_scatter_tensor(g, xs[r], op, ws, False), want,
                 approx=op == "AVG", allow_error=allow)
        if op in ("SUM", "MAX"):
            ck.check("reduce_scatter_tensor", label + " stacked",
                     lambda g: _reduce_scatter_tensor(g, xs[r], op, ws, True), want)

    # all_to_all (list): uneven sizes, some empty
    def a2a_rows(src, dst):
        return (src + 2 * dst) % 3

    for dtype in DTYPES:
        key = f"a2a|{dtype}"
        per = [[make(f"{key}|{d}", s, (a2a_rows(s, d), 2), dtype, "full") for d in range(ws)]
               for s in range(ws)]
        ck.check("all_to_all", f"dtype={short(dtype)} uneven",
                 lambda g: _all_to_all(g, ctx, per[r], [(a2a_rows(s, r), 2) for s in range(ws)], dtype),
                 [per[s][r] for s in range(ws)])

    # all_to_all_single: equal splits (every dtype) and uneven splits with empty ones
    for dtype in DTYPES:
        k = 5
        xs = inputs(f"a2as|{dtype}", (ws * k,), dtype, "full")
        ck.check("all_to_all_single", f"dtype={short(dtype)} equal",
                 lambda g: _all_to_all_single(g, xs[r], ws * k, None, None),
                 [torch.cat([x[r * k:(r + 1) * k] for x in xs])])
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        def rows(src, dst):
            return (3 * src + dst) % 4
        xs = [make(f"a2au|{dtype}", s, (sum(rows(s, d) for d in range(ws)), 3), dtype, "full")
              for s in range(ws)]
        in_splits = [rows(r, d) for d in range(ws)]
        out_splits = [rows(s, r) for s in range(ws)]
        want = torch.cat([xs[s].split([rows(s, d) for d in range(ws)])[r] for s in range(ws)])
        ck.check("all_to_all_single", f"dtype={short(dtype)} uneven 2-d",
                 lambda g: _all_to_all_single(g, xs[r], sum(out_splits), in_splits, out_splits),
                 [want])

    # barrier: nobody leaves before the slow rank arrived
    for slow in sorted({0, ws - 1}):
        ctx.note(f"barrier slow={slow}")
        marker = os.path.join(ctx.tmpdir, f"barrier.{slow}.{r}")
        if r == slow:
            import time
            time.sleep(0.3)
        open(marker, "w").close()
        try:
            dist.barrier()
            missing = [q for q in range(ws)
                       if not os.path.exists(os.path.join(ctx.tmpdir, f"barrier.{slow}.{q}"))]
            if missing:
                ck.fail("barrier", f"slow rank {slow}", f"left the barrier before ranks {missing} entered")
            else:
                ck._count("barrier", "passed")
        except Exception as e:  # noqa: BLE001
            ck.fail("barrier", f"slow rank {slow}", f"raised {type(e).__name__}: {e}")
        dist.barrier(group=ctx.ref)  # keep rounds apart

    # gather / scatter: every dtype, first and last root
    for dtype in DTYPES:
        for root in sorted({0, ws - 1}):
            xs = inputs(f"ga|{dtype}|{root}", (2, 3), dtype, "full")
            ck.check("gather", f"dtype={short(dtype)} root={root}",
                     lambda g: _gather(g, xs[r], root, r, ws), xs if r == root else None)
            chunks = [make(f"sc|{dtype}|{root}|{d}", root, (4,), dtype, "full") for d in range(ws)]
            ck.check("scatter", f"dtype={short(dtype)} root={root}",
                     lambda g: _scatter(g, chunks, root, r, (4,), dtype), [chunks[r]])

    # all_reduce_coalesced
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.int8):
        for op in ("SUM", "MAX"):
            shapes = ((3,), (2, 5), (1,))
            per = [inputs(f"arc|{dtype}|{op}|{i}", s, dtype, kind_for(op)) for i, s in enumerate(shapes)]

            def run(g):
                ts = [p[r].clone() for p in per]
                dist.all_reduce_coalesced(ts, op=rop(op), group=g)
                return ts
            ck.check("all_reduce_coalesced", f"op={op} dtype={short(dtype)}", run,
                     [local_reduce(p, op, dtype) for p in per])

    # PREMUL_SUM (FSDP scales gradients with it): each rank's input times the
    # factor (a float, or a one-element tensor), then SUM. Halves times 0.25
    # or 3 sum exactly in every floating dtype. gloo lacks the op.
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for factor in (0.25, torch.tensor([3.0], dtype=torch.float64)):
            label = f"dtype={short(dtype)} factor={'tensor ' if torch.is_tensor(factor) else ''}" \
                    f"{float(factor)}"
            xs = inputs(f"pm|{dtype}", (ws, 5), dtype)
            scaled = [(x.double() * float(factor)).to(dtype) for x in xs]
            want = local_reduce(scaled, "SUM", dtype)
            pm = dist._make_nccl_premul_sum(factor)

            def all_reduce_pm(g):
                t = xs[r].clone()
                dist.all_reduce(t, op=pm, group=g)
                return [t]
            ck.check("premul_sum", f"all_reduce {label}", all_reduce_pm, [want], use_ref=False)

            def reduce_pm(g, root=ws - 1):
                t = xs[r].clone()
                dist.reduce(t, dst=root, op=pm, group=g)
                return [t]
            # Ranks other than the root keep their input, unscaled.
            ck.check("premul_sum", f"reduce {label}", reduce_pm,
                     [want if r == ws - 1 else xs[r]], use_ref=False)

            def reduce_scatter_tensor_pm(g):
                x = xs[r].clone()
                out = torch.zeros(5, dtype=dtype)
                dist.reduce_scatter_tensor(out, x, op=pm, group=g)
                return [out, x]
            ck.check("premul_sum", f"reduce_scatter_tensor {label} (input unchanged)",
                     reduce_scatter_tensor_pm, [want[r], xs[r]], use_ref=False)

            def reduce_scatter_pm(g):
                chunks = [c.clone() for c in xs[r]]
                out = torch.zeros(5, dtype=dtype)
                dist.reduce_scatter(out, chunks, op=pm, group=g)
                return [out]
            ck.check("premul_sum", f"reduce_scatter {label}", reduce_scatter_pm, [want[r]],
                     use_ref=False)

            def all_reduce_coalesced_pm(g):
                ts = [xs[r][0].clone(), xs[r][1:].clone()]
                dist.all_reduce_coalesced(ts, op=pm, group=g)
                return ts
            ck.check("premul_sum", f"all_reduce_coalesced {label}", all_reduce_coalesced_pm,
                     [want[0], want[1:]], use_ref=False)

    def premul_on_integers(g):
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0),
                        group=g)
        return [torch.ones(1)]
    # Refused on every rank before anything moves: the expected value is unreachable.
    ck.check("premul_sum", "all_reduce int32 refused", premul_on_integers, [torch.zeros(1)],
             use_ref=False,
             allow_error=r"ReduceOp.PREMUL_SUM is not supported for dtype torch.int32")

    # object collectives (payload sizes differ per rank)
    def obj(q):
        return {"rank": q, "text": "x" * (q * 1000 + 1), "items": list(range(q)), "t": (q, None, 1.5)}

    def gather_objects(g):
        out = [None] * ws
        dist.all_gather_object(out, obj(r), group=g)
        return [out]
    ck.check("all_gather_object", "dicts of uneven size", gather_objects, [[obj(q) for q in range(ws)]])
    for root in sorted({0, ws - 1}):
        def bcast_objects(g):
            lst = [obj(root), "abc" * root, [1, 2, {"k": root}]] if r == root else [None, None, None]
            dist.broadcast_object_list(lst, src=root, group=g)
            return [lst]
        ck.check("broadcast_object_list", f"root={root}", bcast_objects,
                 [[obj(root), "abc" * root, [1, 2, {"k": root}]]])

    if ws in FUNCTIONAL_WORLD_SIZES:
        _functional_checks(ctx, ck, inputs)
    _zero_size_checks(ctx, ck)
    _view_checks(ctx, ck)
    _medium_checks(ctx, ck)
    return ck.result()


def _functional_checks(ctx, ck, inputs):
    """Functional collectives (dispatcher path: torch.ops._c10d_functional)."""
    r, ws = ctx.rank, ctx.world_size
    world = dist.group.WORLD

    def grp(g):
        return world if g is None else g
    xs = inputs("fc|ar", (6,), torch.float32)
    ck.check("functional", "all_reduce sum float32",
             lambda g: [funcol.wait_tensor(funcol.all_reduce(xs[r].clone(), "sum", grp(g)))],
             [local_reduce(xs, "SUM", torch.float32)])
    xi = inputs("fc|max", (6,), torch.int64, "full")
    ck.check("functional", "all_reduce max int64",
             lambda g: [funcol.wait_tensor(funcol.all_reduce(xi[r].clone(), "max", grp(g)))],
             [local_reduce(xi, "MAX", torch.int64)])
    xb = inputs("fc|ag", (3, 2), torch.bfloat16, "full")
    ck.check("functional", "all_gather_tensor bfloat16",
             lambda g: [funcol.wait_tensor(funcol.all_gather_tensor(xb[r].clone(), 0, grp(g)))],
             [torch.cat(xb)])
    xr = inputs("fc|rs", (ws * 4,), torch.float32)
    ck.check("functional", "reduce_scatter_tensor sum float32",
             lambda g: [funcol.wait_tensor(funcol.reduce_scatter_tensor(xr[r].clone(), "sum", 0, grp(g)))],
             [local_reduce([x[r * 4:(r + 1) * 4] for x in xr], "SUM", torch.float32)])
    xa = inputs("fc|a2a", (ws * 2,), torch.float32, "full")
    ck.check("functional", "all_to_all_single float32",
             lambda g: [funcol.wait_tensor(funcol.all_to_all_single(xa[r].clone(), None, None, grp(g)))],
             [torch.cat([x[r * 2:(r + 1) * 2] for x in xa])])


def _zero_size_checks(ctx, ck):
    r, ws = ctx.rank, ctx.world_size
    empty = torch.empty
    for dtype in DTYPES:
        op = "SUM" if dtype != torch.bool else "MAX"
        ck.check("zero_size", f"all_reduce {short(dtype)}", lambda g: _all_reduce(g, empty(0, dtype=dtype), op),
                 [empty(0, dtype=dtype)])
    z = empty(0, 3)
    ck.check("zero_size", "broadcast", lambda g: _broadcast(g, z, 0), [z])
    ck.check("zero_size", "reduce", lambda g: _reduce(g, z, "SUM", 0, r), [z] if r == 0 else None)
    ck.check("zero_size", "all_gather", lambda g: _all_gather(g, z, ws), [z] * ws)
    ck.check("zero_size", "all_gather_into_tensor", lambda g: _all_gather_into(g, z, ws, False), [empty(0, 3)])
    ck.check("zero_size", "reduce_scatter_tensor",
             lambda g: _reduce_scatter_tensor(g, empty(0), "SUM", ws, False), [empty(0)])
    ck.check("zero_size", "all_to_all_single all-empty splits",
             lambda g: _all_to_all_single(g, z, 0, [0] * ws, [0] * ws), [z])
    ck.check("zero_size", "gather", lambda g: _gather(g, z, 0, r, ws), [z] * ws if r == 0 else None)
    ck.check("zero_size", "scatter", lambda g: _scatter(g, [z] * ws, 0, r, (0, 3), torch.float32), [z])


def _view_checks(ctx, ck):
    """Views with a storage offset must work and must not touch bytes outside the view;
    non-contiguous inputs and outputs give exact results (noncontig_checks.py)."""
    r, ws = ctx.rank, ctx.world_size
    cat = "views_and_noncontiguous"

    def guarded(base_fn, lo, n):
        """run base_fn on buf[lo:lo+n] of a buffer full of sentinels; return the view and the guards."""
        def run(g):
            buf = torch.full((lo + n + 5,), -777.0)
            view = buf[lo:lo + n]
            base_fn(g, view)
            return [view.clone(), buf[:lo].clone(), buf[lo + n:].clone()]
        return run
    guards = [torch.full((3,), -777.0), torch.full((5,), -777.0)]

    xs = [make("v|ar", q, (10,), torch.float32) for q in range(ws)]
    ck.check(cat, "all_reduce on an offset view", guarded(
        lambda g, v: (v.copy_(xs[r]), dist.all_reduce(v, group=g)), 3, 10),
        [local_reduce(xs, "SUM", torch.float32)] + guards)
    ck.check(cat, "broadcast into an offset view", guarded(
        lambda g, v: (v.copy_(xs[r]), dist.broadcast(v, src=ws - 1, group=g)), 3, 10),
        [xs[ws - 1]] + guards)
    ck.check(cat, "all_gather_into_tensor into an offset view", guarded(
        lambda g, v: dist.all_gather_into_tensor(v, xs[r].clone(), group=g), 3, 10 * ws),
        [torch.cat(xs)] + guards)
    ck.check(cat, "reduce_scatter_tensor into an offset view", guarded(
        lambda g, v: dist.reduce_scatter_tensor(v, torch.cat(xs)[:ws * 2].clone() * (r + 1), group=g), 3, 2),
        [torch.cat(xs)[r * 2:(r + 1) * 2] * sum(q + 1 for q in range(ws))] + guards)

    noncontiguous_checks(ctx, ck, cat)


def _medium_checks(ctx, ck):
    """Sizes from 256 KiB to 4 MiB: several chunks in any chunked implementation."""
    r, ws = ctx.rank, ctx.world_size
    cat = "medium_sizes"
    for dtype, numel, op in ((torch.float32, (1 << 20) + 3, "SUM"), (torch.bfloat16, 65537, "SUM"),
                             (torch.int64, (1 << 18) + 1, "SUM"), (torch.float64, 100003, "MAX"),
                             (torch.int8, (1 << 20) + 7, "BXOR")):
        xs = [make(f"m|{dtype}", q, (numel,), dtype, kind_for(op)) for q in range(ws)]
        ck.check(cat, f"all_reduce {op} {short(dtype)} numel={numel}",
                 lambda g: _all_reduce(g, xs[r], op), [local_reduce(xs, op, dtype)])
    n = (1 << 18) + 5
    xs = [make("m|ag", q, (n,), torch.float32, "full") for q in range(ws)]
    ck.check(cat, f"all_gather_into_tensor float32 numel={n}",
             lambda g: _all_gather_into(g, xs[r], ws, False), [torch.cat(xs)])
    ck.check(cat, f"broadcast float32 numel={n}", lambda g: _broadcast(g, xs[r], ws - 1), [xs[ws - 1]])
    m = (1 << 18) + 1
    xs = [make("m|rs", q, (ws * m,), torch.float32) for q in range(ws)]
    ck.check(cat, f"reduce_scatter_tensor float32 chunk={m}",
             lambda g: _reduce_scatter_tensor(g, xs[r], "SUM", ws, False),
             [local_reduce([x[r * m:(r + 1) * m] for x in xs], "SUM", torch.float32)])
    k = 1 << 18
    xs = [make("m|a2a", q, (ws * k,), torch.float32, "full") for q in range(ws)]
    ck.check(cat, f"all_to_all_single float32 {k} per peer",
             lambda g: _all_to_all_single(g, xs[r], ws * k, None, None),
             [torch.cat([x[r * k:(r + 1) * k] for x in xs])])


# --------------------------------------------------------------------------- pytest side

_JOBS = {}


def _job(backend, ws):
    key = (backend, ws, harness.current_transport())
    if key not in _JOBS:
        try:
            _JOBS[key] = (None, harness.run_ranks(_collectives_worker, ws, backend, JOB_TIMEOUT_S))
        except AssertionError as e:
            _JOBS[key] = (str(e), None)
    return _JOBS[key]


@pytest.mark.parametrize("category,ws", CASES, ids=[f"{c}-ws{w}" for c, w in CASES])
def test_collective(backend, category, ws):
    err, results = _job(backend, ws)
    if err is not None:
        pytest.fail(f"the {ws}-rank collectives job on {backend} failed, so '{category}' "
                    f"was not checked:\n{err}", pytrace=False)
    lines, counts = summarize(results, category)
    print(f"{category} ws={ws} {backend}: {counts}")
    if lines:
        pytest.fail(f"{len(lines)} failed check(s) in {category} at ws={ws} on {backend} "
                    f"(counts over all ranks: {counts}):\n" + "\n".join(lines[:60]), pytrace=False)
    assert counts, f"no checks ran for {category}"
