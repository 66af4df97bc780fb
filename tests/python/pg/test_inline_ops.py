"""Sync ops run on the caller's thread when nothing is queued ahead of them
(MooncakeBackend::enqueue's inline path), and never overtake queued ops.

Each test checks exact values; the inline counter (`_ops_run_inline`, a test
hook) shows which path ran.
"""

import torch
import torch.distributed as dist

import harness

BACKEND = "mooncake-cpu"


def _inline_count():
    from mooncake import pg
    return pg._lib._ops_run_inline(dist.group.WORLD)


def _sync_ops_run_inline(ctx):
    r, ws = ctx.rank, ctx.world_size
    before = _inline_count()
    total = 0
    for i in range(20):
        t = torch.full((4,), float(r + i))
        dist.all_reduce(t)
        assert t.tolist() == [float(sum(range(ws)) + ws * i)] * 4, (i, t)
        total += 1
    out = torch.empty(ws * 3, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.arange(3) + 10 * r)
    assert out.tolist() == [10 * q + k for q in range(ws) for k in range(3)], out
    dist.barrier()
    ran_inline = _inline_count() - before
    # Async ops take the worker: the counter stays where it was.
    after_sync = _inline_count()
    works = [dist.all_reduce(torch.full((2,), float(r)), async_op=True) for _ in range(5)]
    for w in works:
        w.wait()
    return {"sync": total + 2, "inline": ran_inline, "async_inline": _inline_count() - after_sync}


def test_sync_ops_run_on_the_caller_thread():
    res = harness.run_ranks(_sync_ops_run_inline, 2, BACKEND, timeout_s=120)
    for r, got in enumerate(res):
        # The worker may still be finishing the init barrier's bookkeeping at
        # the first op, which then queues; every later one runs inline.
        assert got["inline"] >= got["sync"] - 1, (r, got)
        assert got["async_inline"] == 0, (r, got)


def _async_then_sync(ctx):
    r, ws = ctx.rank, ctx.world_size
    n = 1 << 20
    results = []
    for i in range(10):
        big = torch.full((n,), float(r + 1 + i))
        small = torch.full((3,), float(10 * (r + 1) + i))
        if r == 0:
            # The sync op must wait for the queued async one: run first, it
            # would meet the peer's big all_reduce and mismatch.
            work = dist.all_reduce(big, async_op=True)
            dist.all_reduce(small)
            work.wait()
        else:
            dist.all_reduce(big)
            dist.all_reduce(small)
        results.append((big[0].item(), big[-1].item(), small.tolist()))
    return results


def test_a_sync_op_never_overtakes_a_queued_async_op():
    res = harness.run_ranks(_async_then_sync, 2, BACKEND, timeout_s=180)
    for r, got in enumerate(res):
        for i, (first, last, small) in enumerate(got):
            want_big = float(sum(q + 1 + i for q in range(2)))
            want_small = float(sum(10 * (q + 1) + i for q in range(2)))
            assert (first, last) == (want_big, want_big), (r, i, first, last)
            assert small == [want_small] * 3, (r, i, small)
