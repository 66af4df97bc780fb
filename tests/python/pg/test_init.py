"""Initialisation of the backend under test.

env:// and tcp:// and an explicit store, with and without pg_options
(pg.MooncakeBackendOptions, current and older overloads), destroy and re-init in
the same processes, world size 1, and launches under torchrun and mp.spawn.
"""

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "dist_script.py")
JOB_TIMEOUT_S = 120
LAUNCH_TIMEOUT_S = 150


def _sanity(ctx, tag):
    """Checks a freshly initialised default group; returns a description of what it saw."""
    r, ws = ctx.rank, ctx.world_size
    assert dist.is_initialized(), f"{tag}: not initialised"
    assert dist.get_backend() == ctx.backend, f"{tag}: get_backend() = {dist.get_backend()!r}"
    assert (dist.get_rank(), dist.get_world_size()) == (r, ws), \
        f"{tag}: rank/world size {(dist.get_rank(), dist.get_world_size())} != {(r, ws)}"
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    assert t.tolist() == [ws * (ws + 1) / 2] * 5, f"{tag}: all_reduce gave {t.tolist()}"
    b = torch.full((3,), r, dtype=torch.int64)
    dist.broadcast(b, src=ws - 1)
    assert b.tolist() == [ws - 1] * 3, f"{tag}: broadcast gave {b.tolist()}"
    out = torch.zeros(ws, dtype=torch.int32)
    dist.all_gather_into_tensor(out, torch.tensor([r * 7], dtype=torch.int32))
    assert out.tolist() == [q * 7 for q in range(ws)], f"{tag}: all_gather gave {out.tolist()}"
    dist.barrier()
    return tag


def _destroy(tag):
    dist.destroy_process_group()
    assert not dist.is_initialized(), f"{tag}: still initialised after destroy_process_group()"


def _set_port(port):
    os.environ["MASTER_PORT"] = str(port)


# --------------------------------------------------------------------------- env:// + re-init

def _env_reinit_worker(ctx, ports):
    done = []
    ctx.init()
    done.append(_sanity(ctx, "env:// first init"))
    _destroy("first")
    for i, port in enumerate(ports):
        _set_port(port)
        ctx.init()
        _sanity(ctx, f"env:// re-init #{i + 1}")
        # a subgroup created, used and torn down with the world
        g = dist.new_group(list(range(ctx.world_size)))
        t = torch.ones(2)
        dist.all_reduce(t, group=g)
        assert t.tolist() == [float(ctx.world_size)] * 2, f"re-init #{i + 1}: subgroup all_reduce {t}"
        _destroy(f"re-init #{i + 1}")
        done.append(f"re-init #{i + 1}")
    return done


def test_env_init_destroy_and_reinit(backend):
    ports = harness.free_ports(3)
    res = harness.run_ranks(_env_reinit_worker, 2, backend, JOB_TIMEOUT_S, init=False, args=(ports,))
    assert all(len(r) == 4 for r in res), res


# --------------------------------------------------------------------------- tcp:// and store=

def _tcp_and_store_worker(ctx, tcp_port, store_port):
    r, ws = ctx.rank, ctx.world_size
    dist.init_process_group(backend=ctx.backend, init_method=f"tcp://127.0.0.1:{tcp_port}",
                            rank=r, world_size=ws, timeout=datetime.timedelta(seconds=60))
    _sanity(ctx, "tcp://")
    _destroy("tcp://")
    store = dist.TCPStore("127.0.0.1", store_port, ws, is_master=(r == 0),
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(backend=ctx.backend, store=store, rank=r, world_size=ws)
    _sanity(ctx, "explicit TCPStore")
    _destroy("explicit TCPStore")
    return True


def test_tcp_init_and_explicit_store(backend):
    tcp_port, store_port = harness.free_ports(2)
    harness.run_ranks(_tcp_and_store_worker, 3, backend, JOB_TIMEOUT_S, init=False,
                      args=(tcp_port, store_port))


# --------------------------------------------------------------------------- pg_options

OPTION_FORMS = ("max_group_size", "max_group_size_is_extension", "active_ranks_tensor")


def _options(form, ws):
    from mooncake import pg
    if form == "max_group_size":
        return pg.MooncakeBackendOptions(ws)
    if form == "max_group_size_is_extension":
        return pg.MooncakeBackendOptions(ws, False)
    if form == "active_ranks_tensor":  # older overload kept for compatibility
        return pg.MooncakeBackendOptions(torch.ones(ws, dtype=torch.int32))
    raise ValueError(form)


def _pg_options_worker(ctx, ports):
    results = {}
    for form, port in zip(OPTION_FORMS, ports):
        ctx.note(f"pg_options form {form}")
        try:
            opts = _options(form, ctx.world_size)
        except Exception as e:  # noqa: BLE001
            results[form] = f"constructing the options raised {type(e).__name__}: {e}"
            continue
        _set_port(port)
        ctx.init(pg_options=opts)
        try:
            _sanity(ctx, f"pg_options={form}")
            results[form] = None
        except Exception as e:  # noqa: BLE001
            results[form] = f"{type(e).__name__}: {e}"
        _destroy(form)
    return results


_OPT_JOB = {}


@pytest.mark.parametrize("form", OPTION_FORMS)
def test_init_with_pg_options(backend, form):
    if not harness.is_mooncake(backend):
        pytest.skip(f"pg_options are backend specific; {backend} is initialised without them elsewhere")
    if backend not in _OPT_JOB:
        try:
            _OPT_JOB[backend] = (None, harness.run_ranks(
                _pg_options_worker, 2, backend, JOB_TIMEOUT_S, init=False,
                args=(harness.free_ports(len(OPTION_FORMS)),)))
        except AssertionError as e:
            _OPT_JOB[backend] = (str(e), None)
    err, res = _OPT_JOB[backend]
    if err:
        pytest.fail(f"the pg_options job failed:\n{err}", pytrace=False)
    bad = [f"[rank {r}] {x[form]}" for r, x in enumerate(res) if x.get(form)]
    assert not bad, f"init with pg_options={form} failed:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- world size 1

def _world_one_worker(ctx, reinit_port):
    assert dist.get_world_size() == 1 and dist.get_rank() == 0
    x = torch.arange(6, dtype=torch.float32)
    for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        assert torch.equal(t, x), f"all_reduce {op} changed a 1-rank tensor: {t}"
    i = torch.tensor([5, -3, 12], dtype=torch.int64)
    for op in ("BAND", "BOR", "BXOR"):
        t = i.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        assert torch.equal(t, i), f"all_reduce {op}: {t}"
    t = x.clone()
    dist.broadcast(t, src=0)
    assert torch.equal(t, x)
    t = x.clone()
    dist.reduce(t, dst=0)
    assert torch.equal(t, x)
    out = [torch.zeros(6)]
    dist.all_gather(out, x)
    assert torch.equal(out[0], x)
    o = torch.zeros(6)
    dist.all_gather_into_tensor(o, x)
    assert torch.equal(o, x)
    dist.reduce_scatter_tensor(o.zero_(), x)
    assert torch.equal(o, x)
    dist.reduce_scatter(o.zero_(), [x.clone()])
    assert torch.equal(o, x)
    dist.all_to_all_single(o.zero_(), x)
    assert torch.equal(o, x)
    g = [torch.zeros(6)]
    dist.gather(x, gather_list=g, dst=0)
    assert torch.equal(g[0], x)
    dist.scatter(o.zero_(), scatter_list=[x.clone()], src=0)
    assert torch.equal(o, x)
    dist.barrier()
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    assert objs == [{"a": 1}]
    lst = ["x", 2]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["x", 2]
    t = x.clone()
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert w.is_completed() and torch.equal(t, x)
    sub = dist.new_group([0])
    t = x.clone()
    dist.all_reduce(t, group=sub)
    assert torch.equal(t, x)
    if ctx.is_mooncake:  # registering the backend twice must be harmless
        import importlib
        import mooncake.pg
        importlib.reload(mooncake.pg)
    dist.destroy_process_group()
    _set_port(reinit_port)
    ctx.init()
    t = x.clone()
    dist.all_reduce(t)
    assert torch.equal(t, x), "all_reduce after re-init at world size 1"
    return True


def test_world_size_one(backend):
    harness.run_ranks(_world_one_worker, 1, backend, JOB_TIMEOUT_S, args=(harness.free_port(),))


# --------------------------------------------------------------------------- launchers

def _launch(cmd, out_dir):
    env = harness.child_env({"MC_TEST_OUT": out_dir})
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the ranks it started
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {LAUNCH_TIMEOUT_S} s:\n{output[-5000:]}",
                    pytrace=False)
    return proc.returncode, output


def _check_launch(backend, rc, output, out_dir, nprocs):
    assert rc == 0, f"launch exited with {rc}:\n{output[-6000:]}"
    for r in range(nprocs):
        path = os.path.join(out_dir, f"rank{r}.json")
        assert os.path.exists(path), f"rank {r} wrote no result:\n{output[-4000:]}"
        with open(path) as f:
            res = json.load(f)
        assert res["backend"] == backend and res["world_size"] == nprocs, res
        assert res["all_reduce"] == [nprocs * (nprocs + 1) / 2] * 4, res
        assert [o["rank"] for o in res["objects"]] == list(range(nprocs)), res
        assert res["broadcast"] == [0, nprocs, 2 * nprocs], res


def test_torchrun(backend):
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(harness.free_port()),
               SCRIPT, "--backend", backend, "--out", out]
        rc, output = _launch(cmd, out)
        _check_launch(backend, rc, output, out, 2)


def test_mp_spawn(backend):
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, SCRIPT, "--mode", "mpspawn", "--nprocs", "2", "--backend", backend,
               "--out", out] + (["--pg-options"] if harness.is_mooncake(backend) else [])
        rc, output = _launch(cmd, out)
        _check_launch(backend, rc, output, out, 2)
