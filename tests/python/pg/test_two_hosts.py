"""mooncake-cpu across two "hosts": ranks in two network namespaces (netns.py).

Ranks 0 and 1 run in the first namespace, 2 and 3 in the second, each pair with
its own veth address as MC_HOST_IP; the TCPStore is on rank 0's address. Pairs
inside a namespace may use shared memory, pairs across must use TCP over the
veth: a wrong same-host decision (the shm transport's abstract unix socket
exists per namespace) or a listener bound to loopback fails here, while the
same-host MC_FORCE_TCP runs cannot see either.

Checks every collective and P2P pattern against values computed here, then the
SIGKILL scenario: a rank of the second namespace dies, the survivors' call fails
naming it and the next call among the survivors is exact. Skips, with the
reason, where network namespaces cannot be made (not root, no iproute2).
"""

import os
import signal

import pytest
import torch

import harness
import netns

WORLD = 4
NS_OF_RANK = (0, 0, 1, 1)
FAST = {"MC_PG_TIMEOUT_MS": "5000", "MC_PG_RECONCILE_WINDOW_MS": "5000"}

pytestmark = pytest.mark.skipif(
    not harness.is_mooncake(harness.backend_under_test()),
    reason="the two-namespace run tests the mooncake transports' host decisions")


@pytest.fixture(scope="module")
def hosts():
    try:
        with netns.two_hosts() as h:
            yield h
    except netns.NamespacesUnavailable as e:
        pytest.skip(f"two network namespaces cannot be made here: {e}")


def _placement(hosts):
    return dict(
        env={**FAST, "MASTER_ADDR": hosts.addrs[0]},
        rank_env={r: {"MC_HOST_IP": hosts.addrs[NS_OF_RANK[r]]} for r in range(WORLD)},
        netns={r: hosts.names[NS_OF_RANK[r]] for r in range(WORLD)})


def _vals(rank, n, dtype=torch.float32):
    """Rank-specific exact values (small integers: every sum is exact)."""
    return (torch.arange(n, dtype=torch.int64) % 7 + 10 * (rank + 1)).to(dtype)


def _collectives(ctx):
    import torch.distributed as dist
    r, ws = ctx.rank, ctx.world_size
    done = []

    for n in (5, 1 << 16):  # one small message, one that takes the chunked path
        x = _vals(r, n)
        dist.all_reduce(x)
        assert torch.equal(x, sum(_vals(q, n) for q in range(ws))), f"all_reduce n={n}"
        m = _vals(r, n)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        assert torch.equal(m, _vals(ws - 1, n)), f"all_reduce MAX n={n}"
    done.append("all_reduce")

    for root in range(ws):
        b = _vals(r, 1000, torch.int32) if r == root else torch.zeros(1000, dtype=torch.int32)
        dist.broadcast(b, src=root)
        assert torch.equal(b, _vals(root, 1000, torch.int32)), f"broadcast root={root}"
    done.append("broadcast")

    red = _vals(r, 300)
    dist.reduce(red, dst=3)
    if r == 3:
        assert torch.equal(red, sum(_vals(q, 300) for q in range(ws))), "reduce"
    done.append("reduce")

    outs = [torch.empty(77, dtype=torch.int64) for _ in range(ws)]
    dist.all_gather(outs, _vals(r, 77, torch.int64))
    assert all(torch.equal(outs[q], _vals(q, 77, torch.int64)) for q in range(ws)), "all_gather"
    into = torch.empty(ws * 4096)
    dist.all_gather_into_tensor(into, _vals(r, 4096))
    assert torch.equal(into, torch.cat([_vals(q, 4096) for q in range(ws)])), "all_gather_into"
    done.append("all_gather")

    rs_in = torch.cat([_vals(r, 500) + p for p in range(ws)])
    rs_out = torch.empty(500)
    dist.reduce_scatter_tensor(rs_out, rs_in)
    assert torch.equal(rs_out, sum(_vals(q, 500) + r for q in range(ws))), "reduce_scatter"
    rs_list = torch.empty(40)
    dist.reduce_scatter(rs_list, [_vals(r, 40) * (p + 1) for p in range(ws)])
    assert torch.equal(rs_list, sum(_vals(q, 40) for q in range(ws)) * (r + 1)), "reduce_scatter"
    done.append("reduce_scatter")

    # Uneven all_to_all: rank r sends p + r + 1 rows of 100 * r + p to rank p.
    send = [p + r + 1 for p in range(ws)]
    recv = [r + q + 1 for q in range(ws)]
    a_in = torch.cat([torch.full((send[p], 3), 100.0 * r + p) for p in range(ws)])
    a_out = torch.empty(sum(recv), 3)
    dist.all_to_all_single(a_out, a_in, recv, send)
    expect = torch.cat([torch.full((recv[q], 3), 100.0 * q + r) for q in range(ws)])
    assert torch.equal(a_out, expect), "all_to_all_single uneven"
    lists_out = [torch.empty(r + 2, dtype=torch.int32) for _ in range(ws)]
    dist.all_to_all(lists_out, [torch.full((p + 2,), 10 * r + p, dtype=torch.int32)
                                for p in range(ws)])
    assert all(torch.equal(lists_out[q], torch.full((r + 2,), 10 * q + r, dtype=torch.int32))
               for q in range(ws)), "all_to_all lists"
    done.append("all_to_all")

    g = [torch.empty(9) for _ in range(ws)] if r == 1 else None
    dist.gather(_vals(r, 9), g, dst=1)
    if r == 1:
        assert all(torch.equal(g[q], _vals(q, 9)) for q in range(ws)), "gather"
    sc = torch.empty(9)
    dist.scatter(sc, [_vals(q, 9) * 2 for q in range(ws)] if r == 2 else None, src=2)
    assert torch.equal(sc, _vals(r, 9) * 2), "scatter"
    done.append("gather_scatter")

    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": r, "pid": os.getpid()})
    assert [o["rank"] for o in objs] == list(range(ws)), "all_gather_object"
    bobj = [{"from": r}] if r == 2 else [None]
    dist.broadcast_object_list(bobj, src=2)
    assert bobj == [{"from": 2}], "broadcast_object_list"
    dist.barrier()
    done.append("barrier_objects")
    return done


def _p2p(ctx):
    import torch.distributed as dist
    r, ws = ctx.rank, ctx.world_size
    # Across the namespaces (0<->2, 1<->3) and inside one (0<->1, 2<->3), both ways.
    for peer in ((r + 2) % ws, r ^ 1):
        n = 1 << 17
        mine = _vals(r, n) + peer
        got = torch.empty(n)
        if r < peer:
            dist.send(mine, dst=peer, tag=7)
            dist.recv(got, src=peer, tag=7)
        else:
            dist.recv(got, src=peer, tag=7)
            dist.send(mine, dst=peer, tag=7)
        assert torch.equal(got, _vals(peer, n) + r), f"send/recv with {peer}"
    # A ring in one batch: everyone sends first.
    right, left = (r + 1) % ws, (r - 1) % ws
    out = torch.empty(1000, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, _vals(r, 1000, torch.int64), right),
           dist.P2POp(dist.irecv, out, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(out, _vals(left, 1000, torch.int64)), "batch_isend_irecv ring"
    return "p2p"


def _killed(ctx):
    import torch.distributed as dist
    from mooncake import pg
    x = torch.ones(3)
    dist.all_reduce(x)
    assert x.tolist() == [4.0] * 3, x
    if ctx.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    try:
        work.wait()
        raise AssertionError("all_reduce with a peer killed in the other namespace succeeded")
    except dist.DistBackendError as e:
        assert "3" in str(e), f"the error does not name rank 3: {e}"
    assert work.local_success() is False
    assert work.failed_ranks_hint().tolist() == [0, 0, 0, 1], work.failed_ranks_hint()
    assert pg.get_active_ranks(dist.group.WORLD).tolist() == [1, 1, 1, 0]
    y = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(y)
    assert y.tolist() == [6.0] * 3, y
    return "survived"


def _opts_four(world_size):
    from mooncake import pg
    return pg.MooncakeBackendOptions(4)


def test_collectives_across_namespaces(hosts, backend):
    res = harness.run_ranks(_collectives, WORLD, backend, timeout_s=180, ref_group=False,
                            **_placement(hosts))
    assert all(r == res[0] for r in res) and len(res[0]) == 8, res


def test_p2p_across_namespaces(hosts, backend):
    res = harness.run_ranks(_p2p, WORLD, backend, timeout_s=180, ref_group=False,
                            **_placement(hosts))
    assert res == ["p2p"] * WORLD, res


def test_sigkill_across_namespaces(hosts, backend):
    # Pairs across the namespaces always use TCP.
    res = harness.run_ranks(_killed, WORLD, backend, timeout_s=180, ref_group=False,
                            pg_options=_opts_four, expect_killed=[3], **_placement(hosts))
    assert res[:3] == ["survived"] * 3 and isinstance(res[3], harness.Killed), res
