"""Mismatched calls in a row on ONE group (issue 9, item 4; pg-user-guide.md, Errors).

The user guide promises that calls that differ between ranks (element count,
dtype, reduce op, root, the collective itself, split sizes) fail on every rank
with the same message naming the rank and the differing field, and that the
group stays usable. test_bad_input.py checks each kind on a fresh group; here
one group (3 ranks, 60 s timeout) goes through every kind in a row, plus a call
one rank fails locally, and after each one a correct all_reduce must give the
exact sum. A mismatch noticed only by the collective timeout would show up as
a TIMEOUT message (and a job that runs into the watchdog), not as the field.
"""

import re

import pytest
import torch
import torch.distributed as dist

import harness

WORLD = 3
GROUP_TIMEOUT_S = 60


def _a2a_splits(r):
    """all_to_all_single where rank 2 expects 2 elements from rank 0, which sends 1."""
    out_splits = [2, 1, 1] if r == 2 else [1, 1, 1]
    return dict(input_split_sizes=[1, 1, 1], output_split_sizes=out_splits), sum(out_splits)


def _cases():
    """name -> (call(rank) run by every rank, the substring every rank's error must
    contain, or {rank: substring} where ranks are told different things)."""
    odd = WORLD - 1

    def ar_count(r):
        dist.all_reduce(torch.ones(12 if r == odd else 10))

    def ar_dtype(r):
        dist.all_reduce(torch.ones(10, dtype=torch.float64 if r == odd else torch.float32))

    def ar_op(r):
        dist.all_reduce(torch.ones(10), op=dist.ReduceOp.MAX if r == odd else dist.ReduceOp.SUM)

    def bc_root(r):
        dist.broadcast(torch.ones(8), src=1 if r == odd else 0)

    def reduce_root(r):
        dist.reduce(torch.ones(8), dst=0 if r == odd else 1)

    def kind(r):
        if r == odd:
            dist.broadcast(torch.ones(10), src=0)
        else:
            dist.all_reduce(torch.ones(10))

    def a2a(r):
        kw, n = _a2a_splits(r)
        dist.all_to_all_single(torch.zeros(n), torch.ones(3), **kw)

    def local(r):
        # Rank 0 keeps 1 element for itself but expects 3 from itself: the core
        # rejects that on rank 0 alone, before any exchange.
        if r == 0:
            dist.all_to_all_single(torch.zeros(5), torch.ones(5), input_split_sizes=[1, 2, 2],
                                   output_split_sizes=[3, 1, 1])
        else:
            dist.all_to_all_single(torch.zeros(5), torch.ones(5), input_split_sizes=[3, 1, 1],
                                   output_split_sizes=[2, 2, 1] if r == 1 else [2, 1, 2])

    return {
        "all_reduce count": (ar_count, "all_reduce: rank 2 passed count=12, rank 0 passed count=10"),
        "all_reduce dtype": (ar_dtype, "all_reduce: rank 2 passed dtype=float64, rank 0 passed dtype=float32"),
        "all_reduce op": (ar_op, "all_reduce: rank 2 passed op=max, rank 0 passed op=sum"),
        "broadcast root": (bc_root, "broadcast: rank 2 passed root=1, rank 0 passed root=0"),
        "reduce root": (reduce_root, "reduce: rank 2 passed root=0, rank 0 passed root=1"),
        # Each rank's message starts with its own call's name; the rest is the same.
        "collective": (kind, "rank 2 passed collective=broadcast, rank 0 passed collective=all_reduce"),
        # Only the two ranks of the pair can name it (the others see a digest
        # that does not add up); pg-user-guide.md says so.
        "all_to_all splits": (a2a, {
            0: "all_to_all_v: rank 0 passed send_bytes[2]=4, rank 2 passed recv_bytes[0]=8",
            1: "all_to_all_v: some rank's recv_bytes[sender] differs from that sender's "
               "send_bytes[receiver]; the two ranks concerned name the pair",
            2: "all_to_all_v: rank 0 passed send_bytes[2]=4, rank 2 passed recv_bytes[0]=8"}),
        "rank 0 fails locally": (local, "(rank 0 failed the call before the exchange; it fails on every rank)"),
    }


def _sequence(ctx):
    r = ctx.rank
    out = []
    for i, (name, (call, _)) in enumerate(_cases().items()):
        ctx.note(f"mismatch {name}")
        err = None
        try:
            call(r)
        except Exception as e:  # noqa: BLE001 - the error is the result under test
            err = (type(e).__name__, isinstance(e, dist.DistBackendError), str(e))
        # The same group, right after: an exact sum proves the ranks are in step.
        t = torch.full((7,), (r + 1) * 100 + i, dtype=torch.int64)
        dist.all_reduce(t)
        out.append({"name": name, "error": err, "after": t.tolist()})
    return out


def test_every_mismatch_kind_in_a_row_on_one_group(backend):
    if not harness.is_mooncake(backend):
        pytest.skip(f"{backend} does not detect mismatched calls itself (gloo aborts or corrupts)")
    res = harness.run_ranks(_sequence, WORLD, backend, timeout_s=240, pg_timeout_s=GROUP_TIMEOUT_S,
                            ref_group=False)
    cases = _cases()
    problems = []
    for i, name in enumerate(cases):
        want = cases[name][1]
        cores = set()
        for r in range(WORLD):
            want_text = want[r] if isinstance(want, dict) else want
            o = res[r][i]
            assert o["name"] == name
            want_sum = [sum((q + 1) * 100 + i for q in range(WORLD))] * 7
            if o["after"] != want_sum:
                problems.append(f"{name}: rank {r}'s all_reduce right after gave {o['after']}, expected {want_sum}")
            if o["error"] is None:
                problems.append(f"{name}: rank {r} returned normally")
                continue
            typ, is_backend_error, message = o["error"]
            if not is_backend_error:
                problems.append(f"{name}: rank {r} raised {typ}, expected DistBackendError: {message[:300]}")
            if want_text not in message:
                problems.append(f"{name}: rank {r}'s error lacks {want_text!r}: {message[:500]}")
            if re.search(r"(?i)timeout|timed out", message):
                problems.append(f"{name}: rank {r} waited for the collective timeout: {message[:500]}")
            # One error for the call: the same text on every rank, but for the
            # "<op> failed on rank N" prefix and the name of the rank's own call.
            cores.add(re.sub(r"^INVALID_ARGUMENT: \w+: ", "", message.split("): ", 1)[-1]))
        if len(cores) > 1 and not isinstance(want, dict):
            problems.append(f"{name}: the ranks' messages differ: {sorted(cores)}")
    assert not problems, "\n".join(problems)
