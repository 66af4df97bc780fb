"""Smoke test of the mooncake-cpu backend: two spawned ranks, env:// rendezvous.

Runs one call of each main entry point through the public torch.distributed
API and compares with values computed here. A watchdog kills hung workers and
fails the test, naming the ranks that did not finish.
"""

import multiprocessing
import os
import queue
import socket
import sys
import time
import traceback

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))), "python")
if _PYTHON not in sys.path:
    sys.path.insert(0, _PYTHON)

WORLD = 2
WATCHDOG_S = 180
OP_TIMEOUT_MS = "60000"


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_collectives(rank, world):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from mooncake import pg

    assert isinstance(dist.group.WORLD, pg.MooncakeProcessGroup)
    assert dist.get_world_size() == world and dist.get_rank() == rank
    assert dist.get_backend() == "mooncake-cpu"
    assert pg.get_active_ranks(dist.group.WORLD).tolist() == [1] * world

    total = sum(r + 1 for r in range(world))
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    assert x.tolist() == [float(total)] * 5, x

    i = torch.tensor([rank + 1, 10 * (rank + 1)], dtype=torch.int64)
    dist.all_reduce(i, op=dist.ReduceOp.MAX)
    assert i.tolist() == [world, 10 * world], i

    b = torch.arange(4, dtype=torch.float64) if rank == 1 else torch.zeros(4, dtype=torch.float64)
    dist.broadcast(b, src=1)
    assert b.tolist() == [0.0, 1.0, 2.0, 3.0], b

    gathered = [torch.empty(3, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), rank, dtype=torch.int32))
    assert [g.tolist() for g in gathered] == [[r] * 3 for r in range(world)], gathered

    into = torch.empty(world * 2, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(into, torch.full((2,), float(rank), dtype=torch.bfloat16))
    assert into.float().tolist() == [float(r) for r in range(world) for _ in range(2)], into

    rs_in = torch.arange(world * 3, dtype=torch.float32) * (rank + 1)
    rs_out = torch.empty(3)
    dist.reduce_scatter_tensor(rs_out, rs_in)
    factor = sum(r + 1 for r in range(world))
    expect = [float(v * factor) for v in range(rank * 3, rank * 3 + 3)]
    assert rs_out.tolist() == expect, rs_out

    # Equal splits: block p of rank r holds 100 * r + p.
    a2a_in = torch.tensor([100 * rank + p for p in range(world)], dtype=torch.int64)
    a2a_out = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(a2a_out, a2a_in)
    assert a2a_out.tolist() == [100 * p + rank for p in range(world)], a2a_out

    # Uneven splits: rank r sends p + 1 rows of value 10 * r + p to rank p.
    send_splits = [p + 1 for p in range(world)]
    recv_splits = [rank + 1] * world
    uneven_in = torch.cat([torch.full((p + 1, 2), 10.0 * rank + p) for p in range(world)])
    uneven_out = torch.empty(sum(recv_splits), 2)
    dist.all_to_all_single(uneven_out, uneven_in, recv_splits, send_splits)
    expect = torch.cat([torch.full((rank + 1, 2), 10.0 * p + rank) for p in range(world)])
    assert torch.equal(uneven_out, expect), uneven_out

    dist.barrier()

    # Plain send/recv, both directions.
    peer = 1 - rank
    if rank == 0:
        dist.send(torch.arange(6, dtype=torch.float32), dst=1)
        back = torch.empty(2, dtype=torch.int64)
        dist.recv(back, src=1)
        assert back.tolist() == [7, 8], back
    else:
        got = torch.empty(6)
        dist.recv(got, src=0)
        assert got.tolist() == [float(v) for v in range(6)], got
        dist.send(torch.tensor([7, 8]), dst=0)

    # batch_isend_irecv: both ranks send first, which must not deadlock.
    mine = torch.full((1000,), float(rank))
    theirs = torch.empty(1000)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(theirs, torch.full((1000,), float(peer))), theirs

    # Functional collectives go through the dispatcher and the group registry.
    f = funcol.all_reduce(torch.full((4,), float(rank + 1)), "sum", dist.group.WORLD)
    f = funcol.wait_tensor(f)
    assert f.tolist() == [float(total)] * 4, f

    # async_op: the call returns at once; wait() and the Future both deliver.
    t = torch.full((8,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, pg.MooncakeWork)
    fut = work.get_future()
    assert work.wait()
    assert work.is_success() and work.local_success()
    assert t.tolist() == [float(total)] * 8, t
    value = fut.wait()
    assert torch.equal(value[0], t), value
    assert work.failed_ranks_hint().tolist() == [0] * world

    # Bad arguments fail at the call, on every rank, before any transfer.
    try:
        dist.all_gather([torch.empty(3)], torch.empty(3))
    except (RuntimeError, ValueError) as e:
        assert "one per rank" in str(e), e
    else:
        raise AssertionError("all_gather with a short output list did not fail")

    # The group still works after the rejected call.
    x = torch.ones(2)
    dist.all_reduce(x)
    assert x.tolist() == [float(world)] * 2, x


def _worker(rank, world, port, results):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          RANK=str(rank), WORLD_SIZE=str(world))
        import datetime

        import torch.distributed as dist

        from mooncake import pg  # noqa: F401  (registers the backends)

        dist.init_process_group("mooncake-cpu", init_method="env://", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        try:
            _check_collectives(rank, world)
        finally:
            dist.destroy_process_group()
        results.put((rank, None))
    except BaseException:  # noqa: BLE001  (report everything to the parent)
        results.put((rank, traceback.format_exc()))


def test_smoke_mooncake_cpu():
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    saved = os.environ.get("MC_PG_TIMEOUT_MS")
    os.environ["MC_PG_TIMEOUT_MS"] = OP_TIMEOUT_MS
    try:
        procs = [ctx.Process(target=_worker, args=(r, WORLD, port, results), daemon=True)
                 for r in range(WORLD)]
        for p in procs:
            p.start()
    finally:
        if saved is None:
            os.environ.pop("MC_PG_TIMEOUT_MS", None)
        else:
            os.environ["MC_PG_TIMEOUT_MS"] = saved

    deadline = time.monotonic() + WATCHDOG_S
    reports = {}
    while len(reports) < WORLD and time.monotonic() < deadline:
        try:
            rank, error = results.get(timeout=1.0)
            reports[rank] = error
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) and \
                    all(p.exitcode is not None for p in procs):
                break
    hung = [r for r in range(WORLD) if r not in reports]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(timeout=10)
    if hung:
        codes = {r: procs[r].exitcode for r in hung}
        pytest.fail(f"ranks {hung} did not finish within {WATCHDOG_S}s (exit codes {codes}); "
                    f"reports from the others: {reports}")
    failures = {r: e for r, e in reports.items() if e is not None}
    assert not failures, "\n".join(f"rank {r}:\n{e}" for r, e in sorted(failures.items()))
