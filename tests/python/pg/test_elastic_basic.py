"""Elastic membership basics of the mooncake-cpu backend (seed 000 API).

Covers: MooncakeBackendOptions validation; the two-sided join example as
written in the seed (two founders with MooncakeBackendOptions(3, False), a
joiner with (3, True)); deactivation with holes (world size = highest active
rank + 1); a SIGKILLed rank in the default failure mode.

Timeouts are short (MC_PG_TIMEOUT_MS=3000, window 4000) so failures resolve
in seconds. Measured durations are printed (pytest -s shows them).
"""

import os
import signal
import time

import pytest
import torch

import harness
from elastic_checks import check_failed_work, wait_facts

pytestmark = pytest.mark.skipif(
    not harness.is_mooncake(harness.backend_under_test()),
    reason="elastic membership is a mooncake-cpu feature")

# The membership scenarios run over shared memory and over TCP (MC_FORCE_TCP=1,
# see conftest.py); option validation does not depend on the transport.
both_transports = pytest.mark.both_transports

BACKEND = "mooncake-cpu"
FAST = {"MC_PG_TIMEOUT_MS": "3000", "MC_PG_RECONCILE_WINDOW_MS": "4000"}


def _pg():
    from mooncake import pg
    return pg


# --------------------------------------------------------------------------- options

def test_options_overloads_and_validation():
    pg = _pg()
    mask = torch.zeros(4, dtype=torch.int32)
    forms = [
        pg.MooncakeBackendOptions(4),
        pg.MooncakeBackendOptions(4, True),
        pg.MooncakeBackendOptions(4, False, True, False),
        pg.MooncakeBackendOptions(4, False, False, False),
        pg.MooncakeBackendOptions(mask),
        pg.MooncakeBackendOptions(mask, True),
        pg.MooncakeBackendOptions(mask, False, 4),
        pg.MooncakeBackendOptions(mask, False, max_world_size=4),
    ]
    for o in forms:
        assert o.max_group_size == 4, o
    assert forms[1].is_extension and not forms[0].is_extension
    assert not forms[2].auto_sync_on_failure and forms[2].auto_deactivate_on_failure
    with pytest.raises(ValueError, match="auto_sync_on_failure=True requires"):
        pg.MooncakeBackendOptions(4, False, False, True)
    with pytest.raises(ValueError, match="int32"):
        pg.MooncakeBackendOptions(torch.zeros(4, dtype=torch.float32))
    with pytest.raises(ValueError, match="contiguous"):
        pg.MooncakeBackendOptions(torch.zeros(8, dtype=torch.int32)[::2])
    with pytest.raises(ValueError, match="max_group_size"):
        pg.MooncakeBackendOptions(mask, False, 5)


def _bad_init(ctx, what):
    import torch.distributed as dist
    pg = _pg()
    if what == "too_small":
        opts = pg.MooncakeBackendOptions(1)
    else:  # active_ranks not on CPU
        opts = pg.MooncakeBackendOptions(torch.zeros(ctx.world_size, dtype=torch.int32,
                                                     device="meta"))
    try:
        ctx.init(pg_options=opts)
    except ValueError as e:
        return str(e)
    dist.destroy_process_group()
    return None


@pytest.mark.parametrize("what,pattern", [("too_small", "smaller than the size 2"),
                                          ("device", "needs it on CPU")])
def test_options_rejected_at_init(what, pattern):
    res = harness.run_ranks(_bad_init, 2, BACKEND, timeout_s=60, env=FAST, args=(what,),
                            init=False)
    for msg in res:
        assert msg is not None and pattern in msg, res


# --------------------------------------------------------------------------- join

def _two_sided(ctx):
    import torch.distributed as dist
    pg = _pg()
    if ctx.rank < 2:
        dist.init_process_group(backend=BACKEND, rank=ctx.rank, world_size=2,
                                pg_options=pg.MooncakeBackendOptions(3, False))
        ctx.signal("founders_up")
        backend = dist.group.WORLD
        assert dist.get_world_size() == 2
        assert pg.get_active_ranks(backend).tolist() == [1, 1, 0]
        join_ranks = [2]
        while not all(pg.get_peer_state(backend, join_ranks)):
            time.sleep(0.01)
        pg.recover_ranks(backend, join_ranks)
        t_join = None
    else:
        ctx.wait_for("founders_up", 60)
        dist.init_process_group(backend=BACKEND, rank=2, world_size=3,
                                pg_options=pg.MooncakeBackendOptions(3, True))
        backend = dist.group.WORLD
        # Local-only before join_group: a group of one.
        x = torch.full((4,), 7.0)
        dist.all_reduce(x)
        assert x.tolist() == [7.0] * 4, x
        # The group's size is 2 (founders 0 and 1): no block of the joiner's
        # exists, so its local-only all_gather leaves the output as it was.
        assert dist.get_world_size() == 2
        out = torch.full((2,), -1.0)
        dist.all_gather_into_tensor(out, torch.tensor([7.0]))
        assert out.tolist() == [-1.0, -1.0], out
        # The coalesced forms likewise: the buffers sit in larger tensors whose
        # tails (a block at the joiner's rank 2) must stay as they were.
        gathered = torch.full((3,), -1.0)
        dist.group.WORLD.allgather_into_tensor_coalesced(
            [gathered[:2]], [torch.tensor([7.0])]).wait()
        assert gathered.tolist() == [-1.0, -1.0, -1.0], gathered
        scattered = torch.full((2,), -1.0)
        source = torch.tensor([1.0, 2.0, 99.0])
        dist.group.WORLD.reduce_scatter_tensor_coalesced(
            [scattered[:1]], [source[:2]]).wait()
        assert scattered.tolist() == [-1.0, -1.0], scattered
        pg.join_group(backend)
        t_join = time.monotonic()
    x = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(x)
    first_s = None if t_join is None else time.monotonic() - t_join
    assert x.tolist() == [6.0] * 4, x
    assert dist.get_world_size() == 3
    assert pg.get_active_ranks(backend).tolist() == [1, 1, 1]
    y = torch.tensor([ctx.rank], dtype=torch.int64)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    assert y.item() == 2
    return first_s


@both_transports
def test_seed_two_sided_join():
    res = harness.run_ranks(_two_sided, 3, BACKEND, timeout_s=120, env=FAST, init=False)
    print(f"join_group -> first 3-rank all_reduce done: {res[2] * 1000:.1f} ms")


# --------------------------------------------------------------------------- holes

def _holes(ctx):
    import torch.distributed as dist
    pg = _pg()
    backend = dist.group.WORLD
    x = torch.ones(2)
    dist.all_reduce(x)
    assert x.tolist() == [3.0, 3.0]
    if ctx.rank == 0:
        pg.deactivate_ranks(backend, [1])
    deadline = time.monotonic() + 30
    while pg.get_active_ranks(backend).tolist() != [1, 0, 1, 0]:
        assert time.monotonic() < deadline, pg.get_active_ranks(backend)
        time.sleep(0.01)
    assert dist.get_world_size() == 3  # highest active rank + 1, hole included
    x = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(x)
    if ctx.rank == 1:
        assert x.tolist() == [2.0, 2.0], x  # inactive: local-only
    else:
        assert x.tolist() == [4.0, 4.0], x  # ranks 0 and 2
    # Blocks of ranks that take no part keep what the output held: the hole
    # (rank 1) on the active ranks, every other rank's block on rank 1, which
    # runs local-only and writes only its own block.
    want = [0.0, -1.0, 2.0] if ctx.rank != 1 else [-1.0, 1.0, -1.0]
    out = torch.full((3,), -1.0)
    dist.all_gather_into_tensor(out, torch.tensor([float(ctx.rank)]))
    assert out.tolist() == want, out
    outs = [torch.full((1,), -1.0) for _ in range(3)]
    dist.all_gather(outs, torch.tensor([float(ctx.rank)]))
    assert [t.item() for t in outs] == want, outs
    # Nobody leaves before every rank is done: a rank that leaves (rank 0 also
    # hosts the store) changes the view that rank 1 may still be waiting to see
    # (it once saw [0, 0, 0, 0] and never [1, 0, 1, 0] on a loaded machine).
    ctx.signal(f"done{ctx.rank}")
    for r in range(3):
        ctx.wait_for(f"done{r}", 60)
    return True


@both_transports
def test_deactivate_leaves_hole():
    res = harness.run_ranks(_holes, 3, BACKEND, timeout_s=120, env=FAST,
                            pg_options=_opts_four, ref_group=False)
    assert res == [True] * 3


def _opts_four(world_size):
    return _pg().MooncakeBackendOptions(4)


# --------------------------------------------------------------------------- failure

def _killed(ctx):
    import torch.distributed as dist
    pg = _pg()
    backend = dist.group.WORLD
    x = torch.ones(3)
    dist.all_reduce(x)
    assert x.tolist() == [3.0] * 3
    if ctx.rank == 2:
        # Dies right after its own part of the call, while the others may
        # still be inside it: they need nothing more from rank 2 and must
        # finish the call (abort notices, docs/design/pg-core.md).
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    work = dist.all_reduce(torch.ones(3), async_op=True)
    res = wait_facts(work)
    failed_s = time.monotonic() - t0
    # DistBackendError naming exactly rank 2 ("[failed ranks: 2]"), hint [0, 0, 1],
    # exception() and the future carrying the same error.
    check_failed_work(res, 3, {2}, r"\[failed ranks: 2\]")
    # Default mode: the new view is committed before the Work completes.
    assert pg.get_active_ranks(backend).tolist() == [1, 1, 0]
    assert dist.get_world_size() == 2
    y = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(y)
    assert y.tolist() == [3.0] * 3, y
    return failed_s


@both_transports
def test_killed_rank_default_mode():
    res = harness.run_ranks(_killed, 3, BACKEND, timeout_s=120, env=FAST, ref_group=False,
                            pg_options=_opts_three, expect_killed=[2])
    print(f"SIGKILL -> survivors' failed completion: {res[0]:.2f} s, {res[1]:.2f} s")


def _opts_three(world_size):
    return _pg().MooncakeBackendOptions(3)


# --------------------------------------------------------------------------- deactivated mid-op

def _deactivated_inside(ctx):
    import torch.distributed as dist
    pg = _pg()
    backend = dist.group.WORLD
    dist.barrier()
    if ctx.rank == 2:
        # Queued right behind the barrier, so the worker is inside it long
        # before the deactivation below can commit (that takes a round trip
        # through the Coordinator); ranks 0 and 1 never enter it.
        t0 = time.monotonic()
        work = dist.all_reduce(torch.ones(2), async_op=True)
        ctx.signal("inside")
        res = wait_facts(work)
        told_s = time.monotonic() - t0
        # Not evidence against anyone: no rank is named or marked in the hint.
        check_failed_work(res, 3, set(), r"rank 2 was deactivated in epoch \d+")
        assert "[failed ranks:" not in res["error"][2], res["error"]
        # The notice (data plane) may arrive before the view (control plane).
        deadline = time.monotonic() + 30
        while pg.get_active_ranks(backend).tolist() != [1, 1, 0]:
            assert time.monotonic() < deadline, pg.get_active_ranks(backend)
            time.sleep(0.01)
        # Inactive now: local-only until it joins again.
        x = torch.full((2,), 5.0)
        dist.all_reduce(x)
        assert x.tolist() == [5.0, 5.0], x
        ctx.signal("rejoining")
        pg.join_group(backend)
    else:
        ctx.wait_for("inside", 60)
        if ctx.rank == 0:
            pg.deactivate_ranks(backend, [2])
        deadline = time.monotonic() + 30
        while pg.get_active_ranks(backend).tolist() != [1, 1, 0]:
            assert time.monotonic() < deadline, pg.get_active_ranks(backend)
            time.sleep(0.01)
        # The first op in the new view tells rank 2.
        x = torch.full((2,), float(ctx.rank + 1))
        dist.all_reduce(x)
        assert x.tolist() == [3.0, 3.0], x
        ctx.wait_for("rejoining", 60)
        if ctx.rank == 0:
            while not all(pg.get_peer_state(backend, [2])):
                assert time.monotonic() < deadline + 30
                time.sleep(0.01)
            pg.activate_ranks(backend, [2])
        told_s = None
    y = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(y)
    assert y.tolist() == [6.0, 6.0], y
    return told_s


@both_transports
def test_rank_deactivated_inside_a_call_is_told():
    # A 20 s collective timeout: without the notice rank 2 would wait that long.
    env = dict(FAST, MC_PG_TIMEOUT_MS="20000", MC_PG_RECONCILE_WINDOW_MS="25000")
    res = harness.run_ranks(_deactivated_inside, 3, BACKEND, timeout_s=120, env=env,
                            ref_group=False, pg_options=_opts_three)
    assert res[2] < 10.0, res
    print(f"deactivation -> dropped rank's op failed: {res[2]:.2f} s")


# --------------------------------------------------------------------------- stale generation

def _observed_store_class():
    import torch.distributed as dist

    class ObservedStore(dist.Store):
        """Forwards every call to `inner`; runs `on_closed` after each read of a
        generation's closed mark (the backend reads it only once check() found it)."""

        def __init__(self, inner, on_closed):
            super().__init__()
            self._inner = inner
            self._on_closed = on_closed

        def set(self, key, value):
            self._inner.set(key, value)

        def get(self, key):
            value = self._inner.get(key)
            if key.endswith("/closed"):
                self._on_closed()
            return value

        def add(self, key, value):
            return self._inner.add(key, value)

        def check(self, keys):
            return self._inner.check(keys)

        def wait(self, keys, *timeout):
            self._inner.wait(keys, *timeout)

        def deleteKey(self, key):  # noqa: N802 - torch's Python Store trampoline uses the C++ name
            return self._inner.delete_key(key)

        def num_keys(self):
            return self._inner.num_keys()

    return ObservedStore


def _ObservedStore(inner, on_closed):
    return _observed_store_class()(inner, on_closed)


def _stale_generation(ctx):
    from datetime import timedelta

    import torch.distributed as dist
    pg = _pg()
    # One store for both group instances, so the destroyed instance's
    # generation is still published when the joiner looks.
    store = dist.TCPStore("127.0.0.1", ctx.port, is_master=ctx.rank == 0,
                          wait_for_workers=False, timeout=timedelta(seconds=60))
    if ctx.rank < 2:
        dist.init_process_group(backend=BACKEND, store=store, rank=ctx.rank, world_size=2,
                                pg_options=pg.MooncakeBackendOptions(3, False))
        x = torch.ones(1)
        dist.all_reduce(x)
        assert x.item() == 2.0
        dist.destroy_process_group()
        ctx.signal(f"destroyed_{ctx.rank}")
        # The new founders start only once the joiner has read the destroyed
        # generation's closed mark, so the path where it must wait for the
        # next generation is the one taken.
        ctx.wait_for("joiner_saw_closed", 60)
        dist.init_process_group(backend=BACKEND, store=store, rank=ctx.rank, world_size=2,
                                pg_options=pg.MooncakeBackendOptions(3, False))
        backend = dist.group.WORLD
        if ctx.rank == 0:
            deadline = time.monotonic() + 60
            while not all(pg.get_peer_state(backend, [2])):
                assert time.monotonic() < deadline, "the joiner never became ready"
                time.sleep(0.01)
            pg.activate_ranks(backend, [2])
    else:
        ctx.wait_for("destroyed_0", 60)
        ctx.wait_for("destroyed_1", 60)
        seen = _ObservedStore(store, lambda: ctx.signal("joiner_saw_closed"))
        dist.init_process_group(backend=BACKEND, store=seen, rank=2, world_size=3,
                                pg_options=pg.MooncakeBackendOptions(3, True))
        pg.join_group(dist.group.WORLD)
    y = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(y)
    assert y.tolist() == [6.0, 6.0], y
    return True


@both_transports
def test_joiner_skips_a_destroyed_generation():
    res = harness.run_ranks(_stale_generation, 3, BACKEND, timeout_s=120, env=FAST, init=False)
    assert res == [True] * 3


# --------------------------------------------------------------------------- store sharing

def _store_held_by_main_thread(ctx):
    import torch.distributed as dist
    pg = _pg()
    backend = dist.group.WORLD
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == 0:
        # A blocking wait holds this process's store client until rank 1
        # sets the key, which it does only after a membership change that
        # rank 0's Coordinator thread must serve through the store.
        ctx.signal("rank0_waiting")
        t0 = time.monotonic()
        store.wait(["deactivated"])
        waited = time.monotonic() - t0
    else:
        ctx.wait_for("rank0_waiting", 60)
        if ctx.rank == 1:
            pg.deactivate_ranks(backend, [2])
            store.set("deactivated", "1")
        waited = None
    # Only slot 2 is checked: ranks that finished may already have left.
    deadline = time.monotonic() + 30
    while pg.get_active_ranks(backend).tolist()[2] != 0:
        assert time.monotonic() < deadline, pg.get_active_ranks(backend)
        time.sleep(0.01)
    return waited


@both_transports
def test_control_plane_does_not_share_the_callers_store_connection():
    # The store timeout bounds the wait: without a connection of its own the
    # Coordinator could not answer rank 1, and rank 0's wait would time out.
    res = harness.run_ranks(_store_held_by_main_thread, 3, BACKEND, timeout_s=120, env=FAST,
                            ref_group=False, pg_options=_opts_three, pg_timeout_s=20)
    assert res[0] < 15.0, res
