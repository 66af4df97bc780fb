"""Bad input to the backend under test must fail loudly, on every rank, without hanging.

* Shapes or dtypes that differ between ranks (3 ranks, the last one differs):
  every rank raises, naming the mismatch. Each case runs on a fresh
  new_group(timeout=20 s), so one case cannot poison the next.
  On gloo these need TORCH_DISTRIBUTED_DEBUG=DETAIL (gloo alone aborts the
  process or corrupts); on mooncake-cpu the backend must detect them itself.
* Local argument errors (2 ranks): wrong device, unsupported op/dtype, sizes
  that do not fit, out-of-range root and peer. The error must name the argument
  (checked on every backend) and, for mooncake-cpu, the expected value.
* Unlisted dtypes may be supported (then the result must be right) or rejected
  naming the dtype.
"""

import datetime
import re
import time

import pytest
import torch
import torch.distributed as dist

import harness

JOB_TIMEOUT_S = 180


def _outcome(fn):
    t0 = time.monotonic()
    try:
        value = fn()
        return {"raised": None, "value": value, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001
        return {"raised": f"{type(e).__name__}: {e}", "value": None, "seconds": time.monotonic() - t0}


# --------------------------------------------------------------------------- cross-rank mismatch

def _odd(r, ws, a, b):
    return b if r == ws - 1 else a


MISMATCH = {
    "all_reduce_numel": lambda g, r, ws: dist.all_reduce(torch.ones(_odd(r, ws, 10, 12)), group=g),
    "all_reduce_shape_same_numel":
        lambda g, r, ws: dist.all_reduce(torch.ones(_odd(r, ws, (2, 6), (3, 4))), group=g),
    "all_reduce_dtype_same_itemsize":
        lambda g, r, ws: dist.all_reduce(torch.ones(10, dtype=_odd(r, ws, torch.float32, torch.int32)), group=g),
    "all_reduce_dtype":
        lambda g, r, ws: dist.all_reduce(torch.ones(10, dtype=_odd(r, ws, torch.float32, torch.float64)), group=g),
    "broadcast_numel": lambda g, r, ws: dist.broadcast(torch.ones(_odd(r, ws, 10, 12)), src=0, group=g),
    "broadcast_dtype":
        lambda g, r, ws: dist.broadcast(torch.ones(8, dtype=_odd(r, ws, torch.float32, torch.int32)), src=0, group=g),
    "all_gather_into_tensor_numel":
        lambda g, r, ws: dist.all_gather_into_tensor(torch.zeros(ws * _odd(r, ws, 4, 5)),
                                                     torch.ones(_odd(r, ws, 4, 5)), group=g),
    "reduce_scatter_tensor_dtype":
        lambda g, r, ws: dist.reduce_scatter_tensor(
            torch.zeros(2, dtype=_odd(r, ws, torch.bfloat16, torch.float16)),
            torch.ones(2 * ws, dtype=_odd(r, ws, torch.bfloat16, torch.float16)), group=g),
    "reduce_dtype":
        lambda g, r, ws: dist.reduce(torch.ones(6, dtype=_odd(r, ws, torch.float32, torch.int32)), dst=0, group=g),
    "all_to_all_single_numel":
        lambda g, r, ws: dist.all_to_all_single(torch.zeros(ws * _odd(r, ws, 2, 3)),
                                                torch.ones(ws * _odd(r, ws, 2, 3)), group=g),
}
# the error must say what differs: a mismatch, or the quantity (shape/size/count/bytes/dtype)
MISMATCH_ERROR = r"(?i)mismatch|differ|inconsistent|shape|size|numel|count|bytes|dtype|scalar type"
# gloo's debug wrapper does not fingerprint all_to_all_single sizes: gloo then aborts the process.
MISMATCH_GLOO_NA = {"all_to_all_single_numel": "gloo aborts the process (its debug wrapper does not "
                                               "check all_to_all_single sizes)"}


def _mismatch_worker(ctx):
    r, ws = ctx.rank, ctx.world_size
    results = {}
    for name, fn in MISMATCH.items():
        if ctx.backend == "gloo" and name in MISMATCH_GLOO_NA:
            continue
        ctx.note(f"mismatch case {name}")
        g = dist.new_group(backend=ctx.backend, timeout=datetime.timedelta(seconds=20))
        results[name] = _outcome(lambda: fn(g, r, ws))
        ctx.note(f"  -> {results[name]['raised']!r:.200}")
        dist.barrier(group=ctx.ref)
    return results


_JOBS = {}


def _job(name, backend, fn, ws, env=None):
    key = (name, backend)
    if key not in _JOBS:
        try:
            _JOBS[key] = (None, harness.run_ranks(fn, ws, backend, JOB_TIMEOUT_S, env=env))
        except AssertionError as e:
            _JOBS[key] = (str(e), None)
    err, res = _JOBS[key]
    if err:
        pytest.fail(f"the '{name}' job on {backend} failed:\n{err}", pytrace=False)
    return res


@pytest.mark.parametrize("case", list(MISMATCH))
def test_mismatch_across_ranks_errors_on_every_rank(backend, case):
    if backend == "gloo" and case in MISMATCH_GLOO_NA:
        pytest.skip(f"not checkable on gloo: {MISMATCH_GLOO_NA[case]}")
    # gloo alone aborts or corrupts on mismatches; its debug wrapper checks them on every rank
    env = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if backend == "gloo" else None
    res = _job("mismatch", backend, _mismatch_worker, 3, env)
    problems = []
    for r, per in enumerate(res):
        o = per[case]
        if o["raised"] is None:
            problems.append(f"rank {r} returned normally after {o['seconds']:.1f} s (no error)")
        elif not re.search(MISMATCH_ERROR, o["raised"]):
            problems.append(f"rank {r} raised an error that does not name the mismatch "
                            f"(want {MISMATCH_ERROR!r}): {o['raised'][:500]}")
    assert not problems, f"{case} on {backend}:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- local argument errors
# Each case: run(ctx) performs the bad call. must: regexes every backend's message must match;
# mc_must: extra regexes for mooncake (the expected value); gloo_na: why gloo cannot pass it.
# correct: for "supported or rejected" cases, fn(ctx, value) -> None if the value is right.

def _meta(op):
    def run(ctx):
        t = torch.ones(4, device="meta")
        if op == "all_reduce":
            dist.all_reduce(t)
        elif op == "broadcast":
            dist.broadcast(t, src=0)
        else:
            dist.all_gather_into_tensor(torch.ones(4 * ctx.world_size, device="meta"), t)
    return run


def _cuda(ctx):
    dist.all_reduce(torch.ones(4, device="cuda"))


def _reduce_op(call, op, dtype):
    def run(ctx):
        t = torch.ones(4, dtype=dtype)
        o = getattr(dist.ReduceOp, op)
        if call == "all_reduce":
            dist.all_reduce(t, op=o)
        elif call == "reduce":
            dist.reduce(t, dst=0, op=o)
        else:
            dist.reduce_scatter_tensor(torch.ones(2, dtype=dtype), torch.ones(2 * ctx.world_size, dtype=dtype), op=o)
    return run


def _unlisted(dtype):
    def run(ctx):
        t = torch.ones(4, dtype=dtype)
        dist.all_reduce(t)
        return t.to(torch.float64).tolist()
    return run


def _unlisted_ok(ctx, value):
    return None if value == [float(ctx.world_size)] * 4 else f"supported, but the result {value} != {ctx.world_size}"


def _wrong_size(kind):
    def run(ctx):
        ws = ctx.world_size
        if kind == "all_gather_into_tensor_output":
            dist.all_gather_into_tensor(torch.zeros(4 * ws + 1), torch.ones(4))
        elif kind == "reduce_scatter_tensor_input":
            dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * ws + 3))
        elif kind == "all_to_all_single_splits":
            dist.all_to_all_single(torch.zeros(2 * ws), torch.ones(2 * ws),
                                   input_split_sizes=[3] * ws, output_split_sizes=[2] * ws)
        elif kind == "all_gather_list_length":
            dist.all_gather([torch.zeros(3) for _ in range(ws + 1)], torch.ones(3))
    return run


def _bad_root(kind):
    def run(ctx):
        bad = ctx.world_size + 3
        t = torch.ones(4)
        if kind == "broadcast":
            dist.broadcast(t, src=bad)
        elif kind == "reduce":
            dist.reduce(t, dst=bad)
        elif kind == "gather":
            dist.gather(t, gather_list=None, dst=bad)
        elif kind == "scatter":
            dist.scatter(t, scatter_list=None, src=bad)
    return run


def _bad_peer(kind):
    def run(ctx):
        bad = ctx.world_size + 3
        t = torch.ones(4)
        if kind == "send":
            dist.send(t, dst=bad)
        elif kind == "recv":
            dist.recv(t, src=bad)
        elif kind == "isend":
            dist.isend(t, dst=bad).wait()
        elif kind == "irecv":
            dist.irecv(t, src=bad).wait()
        elif kind == "batch_isend_irecv":
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, bad)]):
                w.wait()
    return run


def _ws_named(ctx):
    """The expected value of a rank argument: the group size must appear in the message."""
    return [rf"\b{ctx.world_size}\b"]


NO_META = "gloo accepts meta tensors silently (torch's meta kernel answers without the backend)"
LOCAL = {
    # wrong device
    "meta_all_reduce": dict(run=_meta("all_reduce"), must=[r"(?i)device|meta"], mc_must=[r"(?i)cpu"], gloo_na=NO_META),
    "meta_broadcast": dict(run=_meta("broadcast"), must=[r"(?i)device|meta"], mc_must=[r"(?i)cpu"], gloo_na=NO_META),
    "meta_all_gather_into_tensor": dict(run=_meta("all_gather_into_tensor"), must=[r"(?i)device|meta"],
                                        mc_must=[r"(?i)cpu"], gloo_na=NO_META),
    "cuda_tensor": dict(run=_cuda, must=[r"(?i)device|cuda"], mc_must=[r"(?i)cpu"], needs_cuda=True,
                        cuda_backend_na="backend 'mooncake' takes CUDA tensors (test_cuda.py checks them)"),
    # unsupported op/dtype
    "all_reduce_BAND_float32": dict(run=_reduce_op("all_reduce", "BAND", torch.float32),
                                    must=[r"(?i)\bBAND\b", r"(?i)float|dtype|integ"]),
    "all_reduce_BOR_bfloat16": dict(run=_reduce_op("all_reduce", "BOR", torch.bfloat16),
                                    must=[r"(?i)\bBOR\b", r"(?i)float|dtype|integ"]),
    "all_reduce_BXOR_float64": dict(run=_reduce_op("all_reduce", "BXOR", torch.float64),
                                    must=[r"(?i)\bBXOR\b", r"(?i)float|double|dtype|integ"]),
    "reduce_BAND_float16": dict(run=_reduce_op("reduce", "BAND", torch.float16),
                                must=[r"(?i)\bBAND\b", r"(?i)float|half|dtype|integ"]),
    "reduce_scatter_tensor_BXOR_float32": dict(run=_reduce_op("reduce_scatter_tensor", "BXOR", torch.float32),
                                               must=[r"(?i)\bBXOR\b", r"(?i)float|dtype|integ"]),
    "all_reduce_AVG_bool": dict(run=_reduce_op("all_reduce", "AVG", torch.bool),
                                must=[r"(?i)bool|dtype"], mc_must=[r"(?i)avg"]),
    "unlisted_dtype_uint32": dict(run=_unlisted(torch.uint32), must=[r"(?i)dtype|type|uint32"],
                                  correct=_unlisted_ok),
    "unlisted_dtype_float8_e5m2": dict(run=_unlisted(torch.float8_e5m2), must=[r"(?i)dtype|type|float8"],
                                       correct=_unlisted_ok),
    # sizes that do not fit
    "all_gather_into_tensor_output_size": dict(run=_wrong_size("all_gather_into_tensor_output"),
                                               must=[r"(?i)size|numel|shape"]),
    "reduce_scatter_tensor_input_size": dict(run=_wrong_size("reduce_scatter_tensor_input"),
                                             must=[r"(?i)size|numel|shape"]),
    "all_to_all_single_split_sum": dict(run=_wrong_size("all_to_all_single_splits"),
                                        must=[r"(?i)split|size|numel"]),
    "all_gather_list_length": dict(run=_wrong_size("all_gather_list_length"),
                                   must=[r"(?i)size|length|number|world|count|list"]),
}
ROOTS = {f"{k}_root_out_of_range": dict(run=_bad_root(k), must=[r"(?i)root|src|dst|rank"], mc_must=_ws_named)
         for k in ("broadcast", "reduce", "gather", "scatter")}
PEERS = {f"{k}_peer_out_of_range": dict(run=_bad_peer(k), must=[r"(?i)peer|dst|src|rank"], mc_must=_ws_named,
                                        gloo_na="gloo hangs on an out-of-range peer instead of raising")
         for k in ("send", "recv", "isend", "irecv", "batch_isend_irecv")}
GROUPS = {"local": LOCAL, "roots": ROOTS, "peers": PEERS}  # one job each: a hang stays in its group


def _local_worker(ctx, group_name, skip):
    results = {}
    for name, spec in GROUPS[group_name].items():
        if name in skip:
            continue
        ctx.note(f"case {name}")
        results[name] = _outcome(lambda: spec["run"](ctx))
        ctx.note(f"  -> {results[name]['raised']!r:.200}")
        dist.barrier(group=ctx.ref)
    # argument errors must not leave the group unusable
    t = torch.full((3,), float(ctx.rank))
    results["__after__"] = _outcome(lambda: (dist.all_reduce(t), t.tolist())[1])
    return results


def _skip_reason(spec, backend):
    if spec.get("needs_cuda") and not torch.cuda.is_available():
        return "no CUDA device on this machine: the CUDA-tensor case cannot run"
    if backend == "mooncake" and spec.get("cuda_backend_na"):
        return f"not an error on {backend}: {spec['cuda_backend_na']}"
    if backend == "gloo" and spec.get("gloo_na"):
        return f"not checkable on gloo: {spec['gloo_na']}"
    return None


def _skips(group_name, backend):
    return {n for n, s in GROUPS[group_name].items() if _skip_reason(s, backend)}


CASES = [(g, n) for g, specs in GROUPS.items() for n in specs]


@pytest.mark.parametrize("group_name,case", CASES, ids=[n for _, n in CASES])
def test_bad_argument(backend, group_name, case):
    spec = GROUPS[group_name][case]
    reason = _skip_reason(spec, backend)
    if reason:
        pytest.skip(reason)
    skip = _skips(group_name, backend)
    if len(skip) == len(GROUPS[group_name]):
        pytest.skip("nothing to run")
    res = _local_job(group_name, backend, skip)
    problems = []
    for r, per in enumerate(res):
        o = per[case]
        ctx_like = type("C", (), {"world_size": len(res), "rank": r})()
        if o["raised"] is None:
            if "correct" in spec:
                bad = spec["correct"](ctx_like, o["value"])
                if bad:
                    problems.append(f"rank {r}: {bad}")
            else:
                problems.append(f"rank {r}: returned normally; expected an error")
            continue
        want = list(spec["must"])
        if harness.is_mooncake(backend):
            extra = spec.get("mc_must", [])
            want += extra(ctx_like) if callable(extra) else extra
        missing = [p for p in want if not re.search(p, o["raised"])]
        if missing:
            problems.append(f"rank {r}: the error does not name {missing}: {o['raised'][:500]}")
    assert not problems, f"{case} on {backend}:\n" + "\n".join(problems)


def _local_job(group_name, backend, skip):
    key = (group_name, backend)
    if key not in _JOBS:
        try:
            _JOBS[key] = (None, harness.run_ranks(_local_worker, 2, backend, JOB_TIMEOUT_S,
                                                  args=(group_name, skip)))
        except AssertionError as e:
            _JOBS[key] = (str(e), None)
    err, res = _JOBS[key]
    if err:
        pytest.fail(f"the '{group_name}' bad-argument job on {backend} failed:\n{err}", pytrace=False)
    return res


@pytest.mark.parametrize("group_name", list(GROUPS))
def test_group_usable_after_argument_errors(backend, group_name):
    skip = _skips(group_name, backend)
    if len(skip) == len(GROUPS[group_name]):
        pytest.skip(f"no {group_name} case runs on {backend}")
    res = _local_job(group_name, backend, skip)
    for r, per in enumerate(res):
        o = per["__after__"]
        assert o["raised"] is None, f"rank {r}: all_reduce after the {group_name} errors raised {o['raised']}"
        assert o["value"] == [1.0] * 3, f"rank {r}: all_reduce after the {group_name} errors gave {o['value']}"


# --------------------------------------------------------------------------- closed group

_CLOSED_GROUP_SCRIPT = r"""
import torch, torch.distributed as dist
import mooncake.pg  # noqa: F401

store = dist.TCPStore("127.0.0.1", 0, 1, True)
dist.init_process_group("mooncake-cpu", store=store, rank=0, world_size=1)
g = dist.group.WORLD
premul = dist._make_nccl_premul_sum(2.0)
t = torch.ones(4)
dist.all_reduce(t, op=premul)
assert t.tolist() == [2.0] * 4, t
dist.destroy_process_group()

ar = dist.AllreduceOptions(); ar.reduceOp = premul
arc = dist.AllreduceCoalescedOptions(); arc.reduceOp = premul
red = dist.ReduceOptions(); red.reduceOp = premul; red.rootRank = 0
for name, call in (("all_reduce", lambda: g.allreduce([t], ar)),
                   ("all_reduce_coalesced", lambda: g.allreduce_coalesced([t], arc)),
                   ("reduce", lambda: g.reduce([t], red))):
    try:
        call()
    except RuntimeError as e:
        assert f"{name} on group" in str(e) and "after the group was shut down" in str(e), e
    else:
        raise SystemExit(f"{name} on a closed group did not raise")
    # PREMUL_SUM multiplies in place only once the group is known to be open.
    assert t.tolist() == [2.0] * 4, (name, t)
print("closed-group checks passed")
"""


def test_premul_sum_on_a_closed_group_raises_and_leaves_the_tensor():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"))
    proc = subprocess.run([sys.executable, "-c", _CLOSED_GROUP_SCRIPT], env=env, timeout=JOB_TIMEOUT_S,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "closed-group checks passed" in proc.stdout, proc.stdout + proc.stderr
