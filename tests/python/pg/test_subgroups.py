"""Subgroups on the backend under test: inference/training layouts and overlapping groups.

* 8 ranks, default group = backend under test: TP x PP x DP = 2 x 2 x 2 with EP
  over 4 ranks; a prefill/decode split of 3 + 5 ranks with KV hand-off;
  overlapping groups created in a shuffled (but rank-consistent) order, with
  unsorted rank lists, a 1-rank group, concurrent async ops on overlapping
  groups, and destroying one subgroup while the others keep working.
* 4 ranks, default group = gloo, groups from new_group(backend=<under test>)
  over all ranks and over subsets.

Expected values are computed locally (pg_checks.make rebuilds any rank's input).
"""

import random

import pytest
import torch
import torch.distributed as dist

import harness
from pg_checks import diff, local_reduce, make

JOB_TIMEOUT_S = 240


class Mismatch(AssertionError):
    pass


def expect(got, want, what):
    d = diff(got, want)
    if d:
        raise Mismatch(f"{what}: {d}")


def _run_sections(ctx, sections):
    results = {}
    for name, fn in sections:
        ctx.note(f"section {name}")
        try:
            fn()
            results[name] = None
        except Exception as e:  # noqa: BLE001
            results[name] = f"{type(e).__name__}: {e}"
            ctx.note(f"FAIL {name}: {results[name][:300]}")
        dist.barrier(group=ctx.ref)
    return results


def _new_groups(rank_lists, backend=None):
    """new_group for every list, in list order, on every rank; returns {tuple(ranks): group or None}."""
    out = {}
    for ranks in rank_lists:
        g = dist.new_group(list(ranks), backend=backend)
        out[tuple(ranks)] = g if dist.get_rank() in ranks else None
    return out


# --------------------------------------------------------------------------- 8-rank layouts

def _layouts_worker(ctx):
    r, ws = ctx.rank, ctx.world_size
    assert ws == 8
    dp, pp, tp = r // 4, (r // 2) % 2, r % 2          # rank = dp*4 + pp*2 + tp
    tp_lists = [[b, b + 1] for b in range(0, 8, 2)]
    pp_lists = [[d * 4 + t, d * 4 + 2 + t] for d in range(2) for t in range(2)]
    dp_lists = [[p * 2 + t, 4 + p * 2 + t] for p in range(2) for t in range(2)]
    ep_lists = [[0, 1, 2, 3], [4, 5, 6, 7]]
    prefill, decode = [0, 1, 2], [3, 4, 5, 6, 7]
    kv_pairs = [[i, 3 + i] for i in range(3)]
    overlap_lists = [[0, 1, 2, 3], [2, 3, 4, 5], [5, 6, 7, 0], [7, 1], [6], [4, 2, 6, 0]]

    # Groups in a shuffled order that is the same on every rank.
    all_lists = tp_lists + pp_lists + dp_lists + ep_lists + [prefill, decode] + kv_pairs + overlap_lists
    order = list(range(len(all_lists)))
    random.Random(7).shuffle(order)
    groups = {}
    for i in order:
        ranks = all_lists[i]
        g = dist.new_group(ranks)
        groups[tuple(ranks)] = g if r in ranks else None

    def mine(lists):
        for ranks in lists:
            if r in ranks:
                return list(ranks), groups[tuple(ranks)]
        return None, None

    tp_ranks, tp_g = mine(tp_lists)
    pp_ranks, pp_g = mine(pp_lists)
    dp_ranks, dp_g = mine(dp_lists)
    ep_ranks, ep_g = mine(ep_lists)

    def group_identity():
        for lists in (tp_lists, pp_lists, dp_lists, ep_lists, [prefill, decode], overlap_lists):
            ranks, g = mine(lists)
            if g is None:
                continue
            srt = sorted(ranks)
            if dist.get_world_size(g) != len(ranks):
                raise Mismatch(f"get_world_size({ranks}) = {dist.get_world_size(g)}")
            if dist.get_rank(g) != srt.index(r):
                raise Mismatch(f"get_rank({ranks}) = {dist.get_rank(g)}, expected {srt.index(r)}")
            if dist.get_process_group_ranks(g) != srt:
                raise Mismatch(f"get_process_group_ranks = {dist.get_process_group_ranks(g)}")

    def tensor_parallel():
        xs = [make("tp|ar", q, (6, 5), torch.bfloat16) for q in tp_ranks]
        t = make("tp|ar", r, (6, 5), torch.bfloat16)
        dist.all_reduce(t, group=tp_g)
        expect(t, local_reduce(xs, "SUM", torch.bfloat16), "TP all_reduce")
        out = torch.zeros(2 * 4, 3)
        dist.all_gather_into_tensor(out, make("tp|ag", r, (4, 3), torch.float32), group=tp_g)
        expect(out, torch.cat([make("tp|ag", q, (4, 3), torch.float32) for q in tp_ranks]), "TP all_gather")
        rs = torch.zeros(3)
        dist.reduce_scatter_tensor(rs, make("tp|rs", r, (6,), torch.float32), group=tp_g)
        me = tp_ranks.index(r)
        want = local_reduce([make("tp|rs", q, (6,), torch.float32)[me * 3:(me + 1) * 3] for q in tp_ranks],
                            "SUM", torch.float32)
        expect(rs, want, "TP reduce_scatter")

    def pipeline_parallel():
        # stage 0 -> stage 1 activations, stage 1 -> stage 0 gradients, addressed by group rank
        stage = pp_ranks.index(r)
        if stage == 0:
            dist.send(make("pp|act", r, (16,), torch.float32), group=pp_g, group_dst=1)
            grad = torch.zeros(16)
            dist.recv(grad, group=pp_g, group_src=1)
            expect(grad, make("pp|grad", pp_ranks[1], (16,), torch.float32), "PP gradient")
        else:
            act = torch.zeros(16)
            dist.recv(act, group=pp_g, group_src=0)
            expect(act, make("pp|act", pp_ranks[0], (16,), torch.float32), "PP activation")
            dist.send(make("pp|grad", r, (16,), torch.float32), group=pp_g, group_dst=0)
        # microbatches in flight with isend/irecv on the PP group
        reqs, outs = [], []
        for mb in range(4):
            if stage == 0:
                reqs.append(dist.isend(torch.full((8,), float(r * 10 + mb)), group=pp_g, group_dst=1))
            else:
                outs.append(torch.zeros(8))
                reqs.append(dist.irecv(outs[-1], group=pp_g, group_src=0))
        for w in reqs:
            w.wait()
        for mb, o in enumerate(outs):
            expect(o, torch.full((8,), float(pp_ranks[0] * 10 + mb)), f"PP microbatch {mb}")

    def data_parallel():
        xs = [make("dp|g", q, (33,), torch.float32) for q in dp_ranks]
        t = make("dp|g", r, (33,), torch.float32)
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=dp_g)
        torch.testing.assert_close(t, local_reduce(xs, "AVG", torch.float32), rtol=1e-6, atol=1e-6)
        b = make("dp|b", r, (4,), torch.int64, "full")
        dist.broadcast(b, group=dp_g, group_src=1)
        expect(b, make("dp|b", dp_ranks[1], (4,), torch.int64, "full"), "DP broadcast from group rank 1")

    def expert_parallel():
        n = len(ep_ranks)
        me = ep_ranks.index(r)

        def rows(s, d):
            return (s * 3 + d * 2) % 5
        x = make("ep|tok", r, (sum(rows(me, d) for d in range(n)), 8), torch.bfloat16, "full")
        out = torch.zeros(sum(rows(s, me) for s in range(n)), 8, dtype=torch.bfloat16)
        dist.all_to_all_single(out, x, output_split_sizes=[rows(s, me) for s in range(n)],
                               input_split_sizes=[rows(me, d) for d in range(n)], group=ep_g)
        want = torch.cat([make("ep|tok", ep_ranks[s], (sum(rows(s, d) for d in range(n)), 8),
                               torch.bfloat16, "full").split([rows(s, d) for d in range(n)])[me]
                          for s in range(n)])
        expect(out, want, "EP dispatch all_to_all_single")

    def prefill_decode():
        side = prefill if r in prefill else decode
        g = groups[tuple(side)]
        xs = [make("pd|ar", q, (12,), torch.float16) for q in side]
        t = make("pd|ar", r, (12,), torch.float16)
        dist.all_reduce(t, group=g)
        expect(t, local_reduce(xs, "SUM", torch.float16), f"all_reduce in {side}")
        # KV hand-off: prefill rank i -> decode rank 3+i, point-to-point on the world group
        # and as a broadcast in the 2-rank group {i, 3+i}
        kv_shape = (2, 4, 16)
        if r in prefill:
            dist.send(make("pd|kv", r, kv_shape, torch.bfloat16, "full"), dst=3 + r)
        elif r - 3 in prefill:
            kv = torch.zeros(kv_shape, dtype=torch.bfloat16)
            dist.recv(kv, src=r - 3)
            expect(kv, make("pd|kv", r - 3, kv_shape, torch.bfloat16, "full"), "KV via send/recv")
        pair, pg = mine(kv_pairs)
        if pg is not None:
            b = make("pd|bc", r, (32,), torch.float32) if r == pair[0] else torch.zeros(32)
            dist.broadcast(b, src=pair[0], group=pg)
            expect(b, make("pd|bc", pair[0], (32,), torch.float32), f"KV broadcast in {pair}")

    def overlapping():
        # every rank walks the groups in one global order and joins the ones it is in
        for ranks in overlap_lists:
            g = groups[tuple(ranks)]
            if g is None:
                continue
            xs = [make(f"ov|{ranks}", q, (9,), torch.int32, "full") for q in ranks]
            t = make(f"ov|{ranks}", r, (9,), torch.int32, "full")
            dist.all_reduce(t, op=dist.ReduceOp.BXOR, group=g)
            expect(t, local_reduce(xs, "BXOR", torch.int32), f"BXOR all_reduce in {ranks}")
            out = [torch.zeros(2, dtype=torch.int64) for _ in ranks]
            dist.all_gather(out, torch.tensor([r, len(ranks)]), group=g)
            expect(torch.stack(out), torch.tensor([[q, len(ranks)] for q in sorted(ranks)]),
                   f"all_gather in {ranks}")
        # async ops outstanding on two overlapping groups at once, issued in one global order
        works = []
        for ranks in ([0, 1, 2, 3], [2, 3, 4, 5], [4, 2, 6, 0]):
            g = groups[tuple(ranks)]
            if g is not None:
                t = torch.full((1000,), float(r + 1))
                works.append((ranks, t, dist.all_reduce(t, group=g, async_op=True)))
        for ranks, t, w in reversed(works):
            w.wait()
            expect(t, torch.full((1000,), float(sum(q + 1 for q in ranks))), f"async all_reduce in {ranks}")

    def destroy_one_subgroup():
        tp = groups[tuple(tp_ranks)]
        dist.destroy_process_group(tp)
        t = torch.ones(4)
        dist.all_reduce(t)
        expect(t, torch.full((4,), float(ws)), "world all_reduce after destroying a subgroup")
        d = torch.full((4,), float(r))
        dist.all_reduce(d, group=dp_g)
        expect(d, torch.full((4,), float(sum(dp_ranks))), "DP all_reduce after destroying TP")
        new_tp = _new_groups(tp_lists)[tuple(tp_ranks)]
        n = torch.full((2,), float(r))
        dist.all_reduce(n, group=new_tp)
        expect(n, torch.full((2,), float(sum(tp_ranks))), "re-created TP group")

    return _run_sections(ctx, [
        ("group_identity", group_identity), ("tensor_parallel", tensor_parallel),
        ("pipeline_parallel", pipeline_parallel), ("data_parallel", data_parallel),
        ("expert_parallel", expert_parallel), ("prefill_decode", prefill_decode),
        ("overlapping_groups", overlapping), ("destroy_one_subgroup", destroy_one_subgroup),
    ])


LAYOUT_SECTIONS = ("group_identity", "tensor_parallel", "pipeline_parallel", "data_parallel",
                   "expert_parallel", "prefill_decode", "overlapping_groups", "destroy_one_subgroup")


# --------------------------------------------------------------------------- beside gloo

def _beside_gloo_worker(ctx, backend):
    r, ws = ctx.rank, ctx.world_size
    assert dist.get_backend() == "gloo"
    harness.import_backend(backend)
    whole = dist.new_group(backend=backend)
    subsets = _new_groups([[1, 2, 3], [3, 0], [2]], backend=backend)

    def backend_names():
        name = dist.get_backend(whole)
        if name != backend:
            raise Mismatch(f"get_backend(new_group(backend={backend!r})) = {name!r}")

    def whole_group():
        xs = [make("bg|ar", q, (20,), torch.float32) for q in range(ws)]
        t = make("bg|ar", r, (20,), torch.float32)
        dist.all_reduce(t, group=whole)
        expect(t, local_reduce(xs, "SUM", torch.float32), "all_reduce")
        out = torch.zeros(ws * 3, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.tensor([r, r * r, -r]), group=whole)
        expect(out, torch.tensor([v for q in range(ws) for v in (q, q * q, -q)]), "all_gather_into_tensor")
        b = make("bg|b", r, (5,), torch.bool)
        dist.broadcast(b, src=ws - 1, group=whole)
        expect(b, make("bg|b", ws - 1, (5,), torch.bool), "broadcast")
        o = torch.zeros(3)
        w = [dist.isend(torch.full((3,), float(r)), (r + 1) % ws, group=whole),
             dist.irecv(o, (r - 1) % ws, group=whole)]
        for x in w:
            x.wait()
        expect(o, torch.full((3,), float((r - 1) % ws)), "isend/irecv ring")

    def subsets_and_default():
        for ranks, g in subsets.items():
            if g is None:
                continue
            t = torch.full((7,), float(r + 1))
            dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=g)
            p = 1.0
            for q in ranks:
                p *= q + 1
            expect(t, torch.full((7,), p), f"PRODUCT all_reduce in {list(ranks)}")
        # the gloo default group still works, interleaved with the other backend's groups
        d = torch.full((3,), float(r))
        dist.all_reduce(d)
        expect(d, torch.full((3,), float(sum(range(ws)))), "gloo default group all_reduce")
        t = torch.ones(2)
        dist.all_reduce(t, group=whole)
        expect(t, torch.full((2,), float(ws)), "all_reduce after the default group")

    return _run_sections(ctx, [("backend_names", backend_names), ("whole_group", whole_group),
                               ("subsets_and_default_group", subsets_and_default)])


BESIDE_SECTIONS = ("backend_names", "whole_group", "subsets_and_default_group")

# --------------------------------------------------------------------------- pytest side

_JOBS = {}


def _job(name, backend):
    key = (name, backend)
    if key not in _JOBS:
        try:
            if name == "layouts":
                res = harness.run_ranks(_layouts_worker, 8, backend, JOB_TIMEOUT_S)
            else:
                res = harness.run_ranks(_beside_gloo_worker, 4, "gloo", JOB_TIMEOUT_S, args=(backend,))
            _JOBS[key] = (None, res)
        except AssertionError as e:
            _JOBS[key] = (str(e), None)
    return _JOBS[key]


def _report(job, backend, section):
    err, results = _job(job, backend)
    if err is not None:
        pytest.fail(f"the '{job}' job on {backend} failed, so '{section}' was not checked:\n{err}",
                    pytrace=False)
    bad = [f"[rank {r}] {res[section]}" for r, res in enumerate(results) if res.get(section)]
    if bad:
        pytest.fail(f"{section} failed on {backend}:\n" + "\n".join(bad), pytrace=False)


@pytest.mark.parametrize("section", LAYOUT_SECTIONS)
def test_layouts_8_ranks(backend, section):
    _report("layouts", backend, section)


@pytest.mark.parametrize("section", BESIDE_SECTIONS)
def test_new_group_beside_gloo_default(backend, section):
    _report("beside_gloo", backend, section)
