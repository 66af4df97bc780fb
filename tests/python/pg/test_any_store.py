"""mooncake-cpu over every kind of c10d Store.

The control plane needs only set/get/add/check/wait/deleteKey, which every
c10d Store implements, so a group works over a FileStore (init_method
"file://", torch's own test default), a HashStore, a PrefixStore over either,
and a TCPStore with either server backend. A store lacking one of those calls
fails init at once, naming the call, instead of timing out.
"""

import datetime
import os
import tempfile
import time

import pytest
import torch

import harness

pytestmark = pytest.mark.skipif(
    not harness.is_mooncake(harness.backend_under_test()),
    reason="these checks are about mooncake-cpu's control plane")

BACKEND = "mooncake-cpu"
FAST = {"MC_PG_TIMEOUT_MS": "10000", "MC_PG_RECONCILE_WINDOW_MS": "12000"}


def _pg():
    from mooncake import pg
    return pg


def _wait_mask(pg, group, want, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while pg.get_active_ranks(group).tolist() != want:
        assert time.monotonic() < deadline, (pg.get_active_ranks(group).tolist(), want)
        time.sleep(0.01)


# --------------------------------------------------------------------------- FileStore

def _file_store_group(ctx, path):
    """Founders 0, 1 (max 3); 2 joins. Collectives, a deactivate/activate, a join."""
    import torch.distributed as dist
    pg = _pg()
    url = "file://" + path
    if ctx.rank < 2:
        dist.init_process_group(backend=BACKEND, init_method=url, rank=ctx.rank, world_size=2,
                                pg_options=pg.MooncakeBackendOptions(3, False))
        ctx.signal("founders_up")
    else:
        ctx.wait_for("founders_up", 120)
        dist.init_process_group(backend=BACKEND, init_method=url, rank=2, world_size=3,
                                pg_options=pg.MooncakeBackendOptions(3, True))
    group = dist.group.WORLD
    if ctx.rank < 2:
        x = torch.full((4,), float(ctx.rank + 1))
        dist.all_reduce(x)
        assert x.tolist() == [3.0] * 4, x
        out = torch.zeros(2)
        dist.all_gather_into_tensor(out, torch.tensor([float(ctx.rank * 10)]))
        assert out.tolist() == [0.0, 10.0], out
        if ctx.rank == 0:
            while not all(pg.get_peer_state(group, [2])):
                time.sleep(0.01)
            pg.activate_ranks(group, [2])
        _wait_mask(pg, group, [1, 1, 1])
    else:
        pg.join_group(group)
    y = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(y)
    assert y.tolist() == [6.0] * 3, y
    assert dist.get_world_size() == 3

    # Deactivate rank 1, run without it, take it back.
    if ctx.rank == 0:
        pg.deactivate_ranks(group, [1])
    _wait_mask(pg, group, [1, 0, 1])
    z = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(z)
    assert z.tolist() == ([2.0] * 2 if ctx.rank == 1 else [4.0] * 2), z
    if ctx.rank == 1:
        ctx.signal("rejoining")
        pg.join_group(group)
    else:
        ctx.wait_for("rejoining", 60)
        if ctx.rank == 0:
            deadline = time.monotonic() + 30
            while not all(pg.get_peer_state(group, [1])):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            pg.activate_ranks(group, [1])
        _wait_mask(pg, group, [1, 1, 1])
    w = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(w)
    assert w.tolist() == [6.0, 6.0], w
    # Every rank's store stays open until the others are done with it.
    dist.barrier()
    return True


def test_file_init_method_collectives_deactivate_activate_and_join():
    path = os.path.join(tempfile.mkdtemp(prefix="mc_filestore_"), "store")
    res = harness.run_ranks(_file_store_group, 3, BACKEND, timeout_s=240, env=FAST, init=False,
                            args=(path,))
    assert res == [True] * 3


# --------------------------------------------------------------------------- TCPStore backends

def _tcp_store(ctx, port, use_libuv, prefixed):
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, ctx.world_size, is_master=ctx.rank == 0,
                          timeout=datetime.timedelta(seconds=60), use_libuv=use_libuv)
    if prefixed:
        store = dist.PrefixStore("outer", store)
    dist.init_process_group(backend=BACKEND, store=store, rank=ctx.rank,
                            world_size=ctx.world_size)
    x = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(x)
    assert x.tolist() == [6.0] * 3, x
    if ctx.rank == 0:
        _pg().deactivate_ranks(dist.group.WORLD, [2])
    _wait_mask(_pg(), dist.group.WORLD, [1, 1, 0])
    # Nobody leaves (which changes the mask) before everyone saw it.
    ctx.signal(f"seen{ctx.rank}")
    for r in range(ctx.world_size):
        ctx.wait_for(f"seen{r}", 60)
    return True


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "classic"])
@pytest.mark.parametrize("prefixed", [False, True], ids=["plain", "prefixed"])
def test_tcp_store_server_backends(use_libuv, prefixed):
    port = harness.free_port()
    res = harness.run_ranks(_tcp_store, 3, BACKEND, timeout_s=180, env=FAST, init=False,
                            args=(port, use_libuv, prefixed))
    assert res == [True] * 3


# --------------------------------------------------------------------------- one process

def _solo(store):
    """One rank over `store`, in this process: init, a collective, destroy."""
    import torch.distributed as dist
    _pg()
    dist.init_process_group(backend=BACKEND, store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    try:
        x = torch.full((3,), 2.0)
        dist.all_reduce(x)
        assert x.tolist() == [2.0] * 3
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _solo_in_child(kind):
    import torch.distributed as dist
    if kind == "hash":
        store = dist.HashStore()
    elif kind == "prefix_hash":
        store = dist.PrefixStore("p", dist.HashStore())
    else:
        path = os.path.join(tempfile.mkdtemp(prefix="mc_filestore_"), "store")
        store = dist.PrefixStore("p", dist.FileStore(path, 1))
    _solo(store)
    return True


def _solo_worker(ctx, kind):
    return _solo_in_child(kind)


@pytest.mark.parametrize("kind", ["hash", "prefix_hash", "prefix_file"])
def test_single_process_stores(kind):
    res = harness.run_ranks(_solo_worker, 1, BACKEND, timeout_s=120, init=False, args=(kind,))
    assert res == [True]


def _incomplete_store(ctx):
    import torch.distributed as dist

    class SetGetOnly(dist.Store):
        def __init__(self):
            super().__init__()
            self.data = {}

        def set(self, key, value):
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()

        def get(self, key):
            return self.data[key]

    _pg()
    t0 = time.monotonic()
    try:
        dist.init_process_group(backend=BACKEND, store=SetGetOnly(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
    except Exception as e:  # noqa: BLE001 - the message is the point
        return f"{type(e).__name__}: {e}", time.monotonic() - t0
    dist.destroy_process_group()
    return None, time.monotonic() - t0


def test_store_without_the_needed_calls_fails_at_once_naming_them():
    [(message, seconds)] = harness.run_ranks(_incomplete_store, 1, BACKEND, timeout_s=120,
                                             init=False)
    print(f"init over a set/get-only store failed after {seconds:.2f} s: {message}")
    assert message is not None, "init over a store without add/check/wait succeeded"
    assert "does not implement" in message, message
    assert "TIMEOUT" not in message and "Coordinator host running" not in message, message
