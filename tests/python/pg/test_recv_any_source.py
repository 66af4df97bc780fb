"""dist.recv / dist.irecv without ``src`` (torch's recv_anysource).

The sender's rank comes back as dist.recv's return value and through
``Work._source_rank()``. Senders race for the recvs, each message lands in
exactly one recv, and per sender and tag messages match recvs in posting
order, any-source ones included. Expected payloads are built from the
sender's rank, so every recv's bytes are checked against the rank it reports.
Runs on gloo too (MC_TEST_BACKEND=gloo), which supports the same calls.
"""

import pytest
import torch
import torch.distributed as dist

import harness

N = 257  # elements per message


def _payload(src, i, dtype=torch.float32):
    return (torch.arange(N, dtype=torch.int64) * 3 + src * 1000 + i).to(dtype)


def _racing(ctx, rounds):
    r, n = ctx.rank, ctx.world_size
    sources = []
    for i in range(rounds):
        if r == 0:
            got = []
            for _ in range(n - 1):
                t = torch.zeros(N)
                src = dist.recv(t, tag=3)
                if not torch.equal(t, _payload(src, i)):
                    return f"round {i}: recv reported rank {src} but holds other data"
                got.append(src)
            sources.append(sorted(got))
        else:
            dist.send(_payload(r, i), 0, tag=3)
        dist.barrier(group=ctx.ref)
    return sources


@pytest.mark.parametrize("world_size", [2, 4])
def test_senders_race_for_any_source_recvs(backend, world_size):
    res = harness.run_ranks(_racing, world_size, backend, timeout_s=120, args=(10,))
    assert res[0] == [list(range(1, world_size))] * 10, res


def _ordering(ctx):
    r = ctx.rank
    if r == 1:
        for i in range(3):
            dist.send(_payload(1, i), 0, tag=5)
        return None
    a, b, c = torch.zeros(N), torch.zeros(N), torch.zeros(N)
    wa = dist.irecv(a, src=1, tag=5)
    wb = dist.irecv(b, tag=5)  # any source, between two tagged recvs
    wc = dist.irecv(c, src=1, tag=5)
    for w in (wa, wb, wc):
        w.wait()
    return {
        "source": wb._source_rank(),
        "in_order": [torch.equal(x, _payload(1, i)) for i, x in enumerate((a, b, c))],
    }


def test_any_source_keeps_posting_order_with_tagged_recvs(backend):
    res = harness.run_ranks(_ordering, 2, backend, timeout_s=120)
    assert res[0] == {"source": 1, "in_order": [True, True, True]}, res


def _subgroup(ctx):
    # Group ranks differ from global ranks: dist.recv returns the global one.
    r = ctx.rank
    sub = dist.new_group([1, 2, 3], backend=ctx.backend)
    out = None
    if r == 1:
        out = []
        for _ in range(2):
            t = torch.zeros(N, dtype=torch.int64)
            src = dist.recv(t, group=sub, tag=9)
            out.append((src, torch.equal(t, _payload(src, 0, torch.int64))))
        out.sort()
    elif r in (2, 3):
        dist.send(_payload(r, 0, torch.int64), 1, group=sub, tag=9)
    dist.barrier(group=ctx.ref)
    return out


def test_any_source_in_a_subgroup_returns_global_ranks(backend):
    res = harness.run_ranks(_subgroup, 4, backend, timeout_s=120)
    assert res[1] == [(2, True), (3, True)], res
