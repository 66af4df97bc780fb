"""Races between the control plane and the data plane of the mooncake-cpu backend.

Each scenario holds one side at a known point, so the race is taken on
purpose rather than left to timing: through a test seam (mooncake.pg's
_test_hold_views: the next view callback waits, with the new view already
committed in the member host), or by stopping a process (SIGSTOP) and
checking /proc that it is stopped before going on.
"""

import os
import signal
import time

import pytest
import torch

import harness
from elastic_checks import check_failed_work, mask, outcome

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


# --------------------------------------------------------------------------- the failed op's wait

# A window far longer than the op timeout, so that an op waiting out the
# window is told apart from one that ends by its deadline by a wide margin.
BOUND_TIMEOUT_S, BOUND_WINDOW_S = 3.0, 24.0
BOUND_ENV = {"MC_PG_TIMEOUT_MS": str(int(BOUND_TIMEOUT_S * 1000)),
             "MC_PG_RECONCILE_WINDOW_MS": str(int(BOUND_WINDOW_S * 1000))}


def _stopped(pid):
    """Whether process `pid` is stopped (SIGSTOP), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def _silent_member_keeps_the_window_open(ctx):
    """Rank 1 dies; rank 2 is alive but silent (SIGSTOPped: its control-plane
    thread answers nothing, so only the window's end settles it), so the
    reconciliation that rank 0's failed all_reduce starts stays open for the
    whole window. Rank 0's Work must still complete by the op's deadline
    (default mode), not when the window closes."""
    import torch.distributed as dist
    x = torch.ones(4)
    dist.all_reduce(x)
    assert x.tolist() == [3.0] * 4, x
    if ctx.rank == 1:
        ctx.signal("dying")
        ctx.kill_self()
    if ctx.rank == 2:
        ctx.signal("stopping", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        # Resumed by rank 0 once the window closed: it was unreachable in it.
        deadline = time.monotonic() + 60
        while mask()[2] != 0:
            assert time.monotonic() < deadline, f"the view is {mask()}; rank 2 is still active"
            time.sleep(0.01)
        ctx.signal("resumed_and_dropped")
        return None
    ctx.wait_for("dying", 60)
    ctx.wait_for("stopping", 60)
    silent = int(ctx.event_payload("stopping"))
    try:
        deadline = time.monotonic() + 60
        while not _stopped(silent):
            assert time.monotonic() < deadline, "rank 2 never stopped"
            time.sleep(0.01)
        t0 = time.monotonic()
        res = outcome(dist.all_reduce(torch.ones(4), async_op=True), t0)
        elapsed = res["elapsed_s"]
        check_failed_work(res, 3, {1}, r"\[failed ranks: 1\]")
        assert elapsed < BOUND_TIMEOUT_S + 6.0, (
            f"the failed op took {elapsed:.1f} s; its deadline was {BOUND_TIMEOUT_S:g} s "
            f"(the window, {BOUND_WINDOW_S:g} s, is what it must not wait out)")
        # The deadline came first: the view is still the old one, and the
        # reconciliation goes on until the window ends.
        assert mask() == [1, 1, 1], mask()
        deadline = time.monotonic() + BOUND_WINDOW_S + 60
        while mask() != [1, 0, 0]:
            assert time.monotonic() < deadline, f"the view is {mask()}, expected [1, 0, 0]"
            time.sleep(0.01)
    finally:
        os.kill(silent, signal.SIGCONT)
    y = torch.full((4,), 5.0)
    dist.all_reduce(y)  # alone now
    assert y.tolist() == [5.0] * 4, y
    # Rank 0 hosts the store: it stays until rank 2 has seen its removal.
    ctx.wait_for("resumed_and_dropped", 60)
    return elapsed


def test_failed_op_waits_for_the_reconciliation_only_until_its_deadline():
    res = harness.run_ranks(_silent_member_keeps_the_window_open, 3, BACKEND, timeout_s=240,
                            env=BOUND_ENV, ref_group=False, expect_killed=[1])
    print(f"failed op completed after {res[0]:.3f} s (op timeout {BOUND_TIMEOUT_S:g} s, "
          f"window {BOUND_WINDOW_S:g} s)")
