"""Races between the control plane and the data plane of the mooncake-cpu backend.

Each scenario holds one side at a known point through a test seam
(mooncake.pg's _test_hold_views: the next view callback waits, with the new
view already committed in the member host), so the race is taken on purpose
rather than left to timing.
"""

import time

import pytest
import torch

import harness

pytestmark = pytest.mark.skipif(
    not harness.is_mooncake(harness.backend_under_test()),
    reason="elastic membership is a mooncake-cpu feature")

BACKEND = "mooncake-cpu"
FAST = {"MC_PG_TIMEOUT_MS": "3000", "MC_PG_RECONCILE_WINDOW_MS": "4000"}


def _pg():
    from mooncake import pg
    return pg


# --------------------------------------------------------------------------- group growth

def _grown_while_the_callback_lags(ctx):
    """Rank 0's view callback is held while rank 2 joins: the worker applies
    the 3-rank view, get_world_size() still says 2, and an all_gather sized
    for 2 ranks must fail with the growth error instead of running with 3
    members into a 2-block output."""
    import torch.distributed as dist
    pg = _pg()
    if ctx.rank < 2:
        dist.init_process_group(backend=BACKEND, rank=ctx.rank, world_size=2,
                                pg_options=pg.MooncakeBackendOptions(3, False))
        backend = dist.group.WORLD
        if ctx.rank == 0:
            pg._lib._test_hold_views(backend, 60.0)
        ctx.signal(f"founder{ctx.rank}_up")
    else:
        ctx.wait_for("founder0_up", 60)
        ctx.wait_for("founder1_up", 60)
        dist.init_process_group(backend=BACKEND, rank=2, world_size=3,
                                pg_options=pg.MooncakeBackendOptions(3, True))
        backend = dist.group.WORLD

    if ctx.rank == 1:
        deadline = time.monotonic() + 60
        while not all(pg.get_peer_state(backend, [2])):
            assert time.monotonic() < deadline, "rank 2 never came up"
            time.sleep(0.01)
        pg.recover_ranks(backend, [2])
    elif ctx.rank == 2:
        pg.join_group(backend)
    else:
        try:
            held = pg._lib._test_await_held_view(backend, 60.0)
            assert held == [1, 1, 1], held
            # The callback has not run: the user still sees two ranks.
            assert dist.get_world_size() == 2
            out = torch.full((2,), -1.0)
            with pytest.raises(RuntimeError, match="grew from 2 to 3"):
                dist.all_gather_into_tensor(out, torch.tensor([5.0]))
            assert out.tolist() == [-1.0, -1.0], out
        finally:
            pg._lib._test_release_views(backend)
        deadline = time.monotonic() + 60
        while dist.get_world_size() != 3:
            assert time.monotonic() < deadline, "the 3-rank view never reached the user"
            time.sleep(0.01)
        ctx.signal("growth_checked")
    ctx.wait_for("growth_checked", 60)
    # Reissued at the new size, the op works on every rank.
    out = torch.full((3,), -1.0)
    dist.all_gather_into_tensor(out, torch.tensor([float(ctx.rank)]))
    assert out.tolist() == [0.0, 1.0, 2.0], out
    ctx.signal(f"done{ctx.rank}")
    for r in range(3):
        ctx.wait_for(f"done{r}", 60)
    return True


def test_growth_is_checked_against_the_applied_view():
    res = harness.run_ranks(_grown_while_the_callback_lags, 3, BACKEND, timeout_s=120, env=FAST,
                            init=False)
    assert res == [True, True, True], res

