"""The `mooncake` backend on CUDA tensors when a rank fails: N processes sharing one GPU.

A rank SIGKILLed during a CUDA all_reduce (under every data path, the kernels
with and without the direct path and with blocking wait), and a rank killed
during all_to_all or stalled (alive, not calling) during all_reduce and
all_to_all. The survivors' op fails naming exactly that rank in bounded
time, the CUDA context stays usable, and after taking the rank out the next
collectives are exact (on the kernels or, after a hole in the view, through
the host). Skipped, with the reason shown, on a machine without a GPU.
"""

import time

import pytest
import torch
import torch.distributed as dist

import harness

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine: the `mooncake` CUDA failure tests need a GPU",
                allow_module_level=True)

from cuda_common import BACKEND, JOB_TIMEOUT_S, PATHS, _device_calls, use_rank_gpu

# The op timeout of the stall cases, set after init (whose bootstrap keeps the
# default): a stalled rank is found when it expires.
STALL_OP_TIMEOUT_S = 5


def _faulted_during_collective(ctx, victim, sync, fault, collective, queued_first=False):
    """`victim` is SIGKILLed (fault "kill") or stays alive without calling the op
    (fault "stall") while the other two ranks run `collective` (all_reduce or
    all_to_all) on CUDA tensors. The survivors' op fails naming exactly the
    victim, in time; they take it out and run exact all_reduces after."""
    import datetime

    from elastic_checks import check_failed_op, outcome
    dev = use_rank_gpu(ctx.rank)
    from mooncake import pg
    opts = pg.MooncakeBackendOptions(3, False, False, False)  # framework-managed: evidence only
    dist.init_process_group(backend=BACKEND, init_method="env://", rank=ctx.rank, world_size=3,
                            pg_options=opts)
    t = torch.ones(8, device=dev)
    dist.all_reduce(t)
    assert t.cpu().tolist() == [3.0] * 8, t
    if fault == "stall":
        # After init, whose bootstrap gets the default timeout.
        dist.group.WORLD.set_timeout(datetime.timedelta(seconds=STALL_OP_TIMEOUT_S))
    # 16 MiB per rank (3 blocks of 4 MiB for all_to_all): the kernels, the
    # direct path included.
    big = torch.full((3 << 20,), ctx.rank + 1, dtype=torch.int32, device=dev)
    if ctx.rank == victim:
        # Faults while the survivors' op waits for it. Not after joining the
        # call: a 12 MiB kernel call finishes in well under a millisecond, so
        # a victim that joined would finish it first.
        for r in range(3):
            if r != victim:
                ctx.wait_for(f"entered_{r}", 60)
        if fault == "kill":
            ctx.kill_self()
        # Stalled: alive, silent, until the survivors have recovered without it.
        ctx.wait_for("survivors_done", 120)
        dist.destroy_process_group()
        return {"stalled": True}
    t0 = time.monotonic()
    if collective == "all_reduce":
        work = dist.all_reduce(big, async_op=True)
    else:
        out = torch.empty_like(big)
        work = dist.all_to_all_single(out, big, async_op=True)
    ctx.signal(f"entered_{ctx.rank}")
    # On the kernel path wait() returns once the kernels are queued (the
    # failure comes later): synchronize() reports it. With blocking wait,
    # and on the staged path, wait() itself raises.
    res = outcome(work, t0, sync=sync)
    bound = STALL_OP_TIMEOUT_S + 25.0 if fault == "stall" else 30.0
    # On the kernel path the failure may come before the kernels are queued
    # (the direct path's exchange of buffers through the host), which fails
    # the Future as well, or after, when the Future has completed; through
    # the windows (queued_first) always after.
    future_fails = (False if queued_first else None) if sync else True
    check_failed_op(res, victim, 3, ctx.rank, bound_s=bound, future_fails=future_fails)
    calls_before = _device_calls()
    # The CUDA context and the group stay usable: the survivors take the
    # victim out and the next CUDA all_reduce succeeds (victim 2: on the
    # kernels, over the two survivors; victim 1: a hole in the view, which
    # the kernel path runs through the host).
    if ctx.rank == 0:
        pg.deactivate_ranks(dist.group.WORLD, [victim])
    deadline = time.monotonic() + 30
    while pg.get_active_ranks(dist.group.WORLD).tolist()[victim] != 0:
        assert time.monotonic() < deadline, f"rank {victim} still active 30 s after deactivate_ranks"
        time.sleep(0.01)
    t = torch.full((8,), float(ctx.rank + 1), device=dev)
    dist.all_reduce(t)
    big = torch.full((3 << 20,), ctx.rank + 1, dtype=torch.int32, device=dev)
    dist.all_reduce(big)
    ctx.signal(f"recovered_{ctx.rank}")
    if all(ctx.signalled(f"recovered_{r}") for r in range(3) if r != victim):
        ctx.signal("survivors_done")
    return {"small": t.cpu().tolist(), "big": sorted(set(big.cpu().tolist())),
            "device_calls": [calls_before, _device_calls()]}


def _check_survivors(res, victim, path):
    # The failed call ran on the kernels through the windows; with the
    # direct path it may have failed before its kernels were queued, in the
    # exchange of buffers.
    first_calls = 2 if path == "kernels-windows" else 1
    path = "kernels" if path == "kernels-windows" else path
    want = float(sum(r + 1 for r in range(3) if r != victim))
    for r in range(3):
        if r == victim:
            continue
        assert res[r]["small"] == [want] * 8 and res[r]["big"] == [int(want)], (r, res[r])
        before, after = res[r]["device_calls"]
        if path == "staged":
            assert after == 0, res[r]
        else:
            # The call before the failed one ran on the kernels; after a hole
            # (victim 1) the host path, else the kernels again.
            assert before >= first_calls, res[r]
            assert after == (before if victim == 1 else before + 2), res[r]


# The kernels through the windows only: the failure always comes after the
# kernels were queued, in the kernels.
WINDOW_ONLY = {"MC_PG_CUDA_PATH": "kernels", "MC_PG_CUDA_DIRECT": "0"}


@pytest.mark.parametrize("path", ["staged", "kernels", "kernels-blocking-wait", "kernels-windows"])
@pytest.mark.parametrize("victim", [1, 2])
def test_sigkilled_rank_during_cuda_all_reduce(victim, path):
    from elastic_checks import ELASTIC_ENV
    env = WINDOW_ONLY if path == "kernels-windows" else PATHS[path]
    sync = path in ("kernels", "kernels-windows")
    res = harness.run_ranks(_faulted_during_collective, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            env={**ELASTIC_ENV, **env},
                            args=(victim, sync, "kill", "all_reduce", path == "kernels-windows"),
                            init=False, ref_group=False, expect_killed=[victim])
    _check_survivors(res, victim, path)


@pytest.mark.parametrize("path", ["staged", "kernels"])
@pytest.mark.parametrize("fault,collective", [("kill", "all_to_all"), ("stall", "all_reduce"),
                                              ("stall", "all_to_all")])
def test_faulted_rank_during_cuda_collective(fault, collective, path):
    """Rank 2 SIGKILLed during all_to_all, or stalled (alive, not calling) during
    all_reduce and all_to_all: the survivors fail naming it, then recover."""
    from elastic_checks import ELASTIC_ENV
    victim = 2
    res = harness.run_ranks(_faulted_during_collective, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            env={**ELASTIC_ENV, **PATHS[path]},
                            args=(victim, path == "kernels", fault, collective), init=False,
                            ref_group=False, expect_killed=[victim] if fault == "kill" else [])
    if fault == "stall":
        assert res[victim] == {"stalled": True}, res[victim]
    _check_survivors(res, victim, path)
