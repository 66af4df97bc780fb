"""Claims of the user guide that no other suite exercised (issue 9, item 10):

* `dist._coalescing_manager` with all_reduce, all_gather_into_tensor and
  reduce_scatter_tensor (torch routes these to the backend's coalesced calls),
  synchronous and with async_ops=True;
* the `mooncake` backend (the CUDA one) with CPU tensors: they take the
  mooncake-cpu path (collectives and P2P);
* `pg.set_device_filter` / `pg.set_host_ip` before init: accepted, the group
  works, and without an RDMA transport `get_preferred_hca` is empty; a host IP
  that is not this host's fails init with the reason (it crashed the process).

One 3-rank job (init done by the workers); each test checks its part of the
results with exact values computed here.
"""

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import harness

WORLD = 3


def _value(rank, i, n):
    return torch.arange(n, dtype=torch.int64) * 10 + (rank + 1) * 1000 + i


def _coalesced(ctx, async_ops):
    r, ws = ctx.rank, ctx.world_size
    got = {}
    ts = [_value(r, i, 5 + i) for i in range(3)]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for t in ts:
            dist.all_reduce(t)
    if async_ops:
        cm.wait()
    got["all_reduce"] = [t.tolist() for t in ts]
    outs = [torch.full((ws * (2 + i),), -1, dtype=torch.int64) for i in range(2)]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for i, o in enumerate(outs):
            dist.all_gather_into_tensor(o, _value(r, i, 2 + i))
    if async_ops:
        cm.wait()
    got["all_gather_into_tensor"] = [o.tolist() for o in outs]
    outs = [torch.full((2 + i,), -1, dtype=torch.int64) for i in range(2)]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for i, o in enumerate(outs):
            dist.reduce_scatter_tensor(o, _value(r, i, ws * (2 + i)))
    if async_ops:
        cm.wait()
    got["reduce_scatter_tensor"] = [o.tolist() for o in outs]
    return got


def _job(ctx):
    from mooncake import pg
    r = ctx.rank
    pg.set_device_filter(["mc_test_no_such_nic"])
    pg.set_host_ip("127.0.0.1")
    ctx.init(backend="mooncake")
    out = {"backend": dist.get_backend(), "hca": list(pg.get_preferred_hca(dist.group.WORLD))}
    t = _value(r, 0, 9)
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    t = _value(r, 1, 4) if r == 1 else torch.zeros(4, dtype=torch.int64)
    dist.broadcast(t, src=1)
    out["broadcast"] = t.tolist()
    # P2P ring: r sends to r + 1, receives from r - 1.
    recv = torch.zeros(6, dtype=torch.int64)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, _value(r, 7, 6), (r + 1) % WORLD),
                                   dist.P2POp(dist.irecv, recv, (r - 1) % WORLD)])
    for q in reqs:
        q.wait()
    out["p2p"] = recv.tolist()
    out["coalesced_sync"] = _coalesced(ctx, False)
    out["coalesced_async"] = _coalesced(ctx, True)
    return out


_RESULTS = {}


def _results(backend):
    if not harness.is_mooncake(backend):
        pytest.skip(f"mooncake claims; {backend} is not a mooncake backend")
    if "res" not in _RESULTS:
        _RESULTS["res"] = harness.run_ranks(_job, WORLD, backend, timeout_s=180, init=False,
                                            pg_timeout_s=60)
    return _RESULTS["res"]


def _want_coalesced(r):
    ws = WORLD
    return {
        "all_reduce": [sum(_value(q, i, 5 + i) for q in range(ws)).tolist() for i in range(3)],
        "all_gather_into_tensor": [torch.cat([_value(q, i, 2 + i) for q in range(ws)]).tolist()
                                   for i in range(2)],
        "reduce_scatter_tensor": [sum(_value(q, i, ws * (2 + i)) for q in range(ws))
                                  [r * (2 + i):(r + 1) * (2 + i)].tolist() for i in range(2)],
    }


@pytest.mark.parametrize("mode", ["coalesced_sync", "coalesced_async"])
def test_coalescing_manager(backend, mode):
    res = _results(backend)
    for r in range(WORLD):
        want = _want_coalesced(r)
        for op in want:
            assert res[r][mode][op] == want[op], f"rank {r} {mode} {op}: {res[r][mode][op]} != {want[op]}"


def test_mooncake_backend_takes_cpu_tensors(backend):
    res = _results(backend)
    for r in range(WORLD):
        o = res[r]
        assert o["backend"] == "mooncake", o["backend"]
        assert o["all_reduce"] == sum(_value(q, 0, 9) for q in range(WORLD)).tolist(), (r, o["all_reduce"])
        assert o["broadcast"] == _value(1, 1, 4).tolist(), (r, o["broadcast"])
        assert o["p2p"] == _value((r - 1) % WORLD, 7, 6).tolist(), (r, o["p2p"])


def test_device_filter_and_host_ip_before_init(backend):
    res = _results(backend)
    for r in range(WORLD):
        # No RDMA transport in this build: the filter names no usable NIC and
        # the engine reports none; the TCP/shared-memory paths are unaffected.
        assert res[r]["hca"] == [], (r, res[r]["hca"])


_BAD_HOST_IP = textwrap.dedent("""
    import torch.distributed as dist
    from mooncake import pg
    pg.set_host_ip("192.0.2.1")  # TEST-NET-1: never an address of this host
    try:
        dist.init_process_group(backend="mooncake-cpu", store=dist.HashStore(), rank=0,
                                world_size=1)
    except Exception as e:  # noqa: BLE001 - the error is the result
        print("ERROR", type(e).__name__, e)
    else:
        print("NO ERROR")
""")


def test_host_ip_not_on_this_host_fails_init_with_the_reason():
    # A process of its own: the setting is process-wide, and the old failure
    # was a segfault.
    r = subprocess.run([sys.executable, "-c", _BAD_HOST_IP], env=harness.child_env({}),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert r.stdout.startswith("ERROR DistBackendError"), r.stdout + r.stderr[-3000:]
    assert "binding 192.0.2.1" in r.stdout, r.stdout
