"""Synchronous kernel calls launched by the calling thread (MC_PG_CUDA_CALLER_LAUNCH=1, the default;
docs/design/pg-cuda.md): exact values for every collective that may take that path, each
op reading what a producer queued just before it on the current stream and read by a
consumer queued just after, mixed with asynchronous calls and calls on a side stream
(which go through the worker); the counters say which path each call took. Skipped, with
the reason shown, on a machine without a GPU.
"""

import pytest
import torch
import torch.distributed as dist

import harness
from cuda_common import BACKEND, JOB_TIMEOUT_S, OP_TIMEOUT_S, PATHS, _device_calls, use_rank_gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine: the `mooncake` CUDA tests need a GPU",
                allow_module_level=True)

OPS = 240
ELEMS = 8


def _one_op(i, rank, ws, dev, async_op):
    """Issues op i (the collective by i % 5) on the current stream and returns (the
    result, cloned on that stream right after the op, and its expected value)."""
    base = torch.full((ELEMS,), float(i), device=dev)
    base.add_(rank + 1)  # the producer: the op must read i + rank + 1
    blocks = torch.arange(ws, device=dev, dtype=torch.float32).repeat_interleave(ELEMS)
    kind = i % 5
    if kind == 0:
        t, work = base, dist.all_reduce(base, async_op=async_op)
        want = torch.full((ELEMS,), float(ws * i + ws * (ws + 1) // 2))
    elif kind == 1:
        t = torch.empty(ws * ELEMS, device=dev)
        work = dist.all_gather_into_tensor(t, base, async_op=async_op)
        want = torch.cat([torch.full((ELEMS,), float(i + r + 1)) for r in range(ws)])
    elif kind == 2:
        t = torch.empty(ELEMS, device=dev)
        work = dist.reduce_scatter_tensor(t, base.repeat(ws) * (blocks + 1), async_op=async_op)
        want = torch.full((ELEMS,), float(sum(i + r + 1 for r in range(ws)) * (rank + 1)))
    elif kind == 3:
        t = torch.empty(ws * ELEMS, device=dev)
        work = dist.all_to_all_single(t, base.repeat(ws) + 100 * blocks, async_op=async_op)
        want = torch.cat([torch.full((ELEMS,), float(i + r + 1 + 100 * rank)) for r in range(ws)])
    else:
        root = i % ws
        t, work = base, dist.broadcast(base, src=root, async_op=async_op)
        want = torch.full((ELEMS,), float(i + root + 1))
    if work is not None:
        work.wait()
    return t.clone(), want  # the consumer, queued after the op (or after wait())


def _mixed(ctx, async_every, side_every):
    from mooncake import pg
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    warm = torch.ones(4, device=dev)
    dist.all_reduce(warm)  # through the worker: the view and window are set up
    before, calls_before = pg._lib._worker_stats(dist.group.WORLD), _device_calls()
    side = torch.cuda.Stream(device=dev)
    got = []
    for i in range(OPS):
        on_side = side_every and i % side_every == side_every - 1
        stream = side if on_side else torch.cuda.current_stream(dev)
        with torch.cuda.stream(stream):
            got.append(_one_op(i, rank, ws, dev, bool(async_every) and i % async_every == 0))
    torch.cuda.synchronize(dev)
    after = pg._lib._worker_stats(dist.group.WORLD)
    failures = [f"rank {rank}: op {i} (kind {i % 5}) gave {t[:4].tolist()}, want {w[:4].tolist()}"
                for i, (t, w) in enumerate(got) if not torch.equal(t.cpu(), w)]
    calls = _device_calls() - calls_before
    if calls != OPS:
        failures.append(f"rank {rank}: {calls} device calls for {OPS} collectives")
    dist.barrier()
    return {"failures": failures, "caller": after["caller_launched"] - before["caller_launched"],
            "worker": after["ops"] - before["ops"]}


def _run(world_size, path, caller_launch, async_every=0, side_every=0):
    env = {**PATHS[path], "MC_PG_CUDA_CALLER_LAUNCH": caller_launch}
    res = harness.run_ranks(_mixed, world_size, BACKEND, args=(async_every, side_every),
                            timeout_s=JOB_TIMEOUT_S, ref_group=False, env=env,
                            pg_timeout_s=OP_TIMEOUT_S)
    failures = [f for r in res for f in r["failures"]]
    assert not failures, "\n".join(failures[:20])
    return res


@pytest.mark.parametrize("path", ["kernels", "kernels-blocking-wait"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_synchronous_calls_launched_by_their_caller_are_exact(world_size, path):
    for rank, r in enumerate(_run(world_size, path, "1")):
        # Back to back on one stream, the caller launches nearly every call; one
        # falls back to the worker when the worker is busy or calls fill the window.
        assert r["caller"] >= OPS // 2 and r["caller"] + r["worker"] >= OPS, (rank, r)


def test_asynchronous_and_side_stream_calls_go_through_the_worker_in_order():
    for rank, r in enumerate(_run(2, "kernels", "1", async_every=7, side_every=11)):
        asynchronous = len(range(0, OPS, 7))
        # Every async call, every side-stream call and the first call back on the
        # main stream after one goes through the worker.
        assert asynchronous <= r["worker"] and 0 < r["caller"] <= OPS - asynchronous, (rank, r)


def test_caller_launch_off_sends_every_call_through_the_worker():
    for rank, r in enumerate(_run(2, "kernels", "0")):
        assert r["caller"] == 0 and r["worker"] >= OPS, (rank, r)
