"""CUDA graphs on the `mooncake` backend: N processes sharing one GPU.

all_reduce (one-shot and chunked two-shot), all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single and broadcast captured in one
torch.cuda.graph (the default, global capture mode) after eager warm-up
calls, then replayed with new inputs each time, with eager calls between
replays: exact against a Python reference every time. Capturing before any
warm-up, and an op that cannot run on the device kernels, are refused with a
clear error and the group works afterwards. A membership change after the
capture (a deactivation, or a rank joining back) makes the next replay's
collectives fail as stale without touching their outputs;
check_graph_replays raises it once; replays already waiting for a member
when it is deactivated fail as stale at once. A peer SIGKILLed while the others
replay is found by the host's watch of the replays (long before the op
timeout), named in the failure, and taken out by the reconciliation that
the replay's report starts. The host watches the replays only while a
graph that holds a captured call exists. Skipped, with the reason shown, on
a machine without a GPU.
"""

import time

import pytest
import torch
import torch.distributed as dist

import harness
from cuda_common import use_rank_gpu, world_sizes

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine: the `mooncake` CUDA graph tests need a GPU",
                allow_module_level=True)

BACKEND = "mooncake"
JOB_TIMEOUT_S = 150
OP_TIMEOUT_S = 60
ENV = {"MC_PG_CUDA_PATH": "kernels"}
N = 1000          # elements per rank block
BIG = 1 << 20     # a 4 MiB float all_reduce: chunked two-shot in the graph
REPLAYS = 5


def _pg():
    from mooncake import pg
    return pg


class Buffers:
    """The graph's static tensors, refilled for round `rnd` before each replay."""

    def __init__(self, ws, dev):
        self.ws = ws
        self.x = torch.empty(N, device=dev)
        self.y = torch.empty(BIG, device=dev)
        self.ag_in = torch.empty(N, device=dev)
        self.ag_out = torch.empty(ws * N, device=dev)
        self.rs_in = torch.empty(ws * N, device=dev)
        self.rs_out = torch.empty(N, device=dev)
        self.a2a_in = torch.empty(ws * N, device=dev)
        self.a2a_out = torch.empty(ws * N, device=dev)
        self.b = torch.empty(N, device=dev)

    @staticmethod
    def inputs(r, ws, rnd):
        """Rank r's inputs in round rnd: small integers, exact in float32."""
        a = torch.arange(ws * N, dtype=torch.float32)
        return {
            "x": (a[:N] % 13) + r + rnd,
            "y": torch.full((BIG,), float(r + 1 + rnd)),
            "ag_in": (a[:N] % 7) + 10 * r + rnd,
            "rs_in": (a % 11) + r + rnd,
            "a2a_in": a + 100000 * r + rnd,
            "b": torch.full((N,), float(1000 * r + rnd)),
        }

    def fill(self, rank, rnd):
        for name, value in self.inputs(rank, self.ws, rnd).items():
            getattr(self, name).copy_(value)

    def ops(self):
        dist.all_reduce(self.x)
        dist.all_reduce(self.y)
        dist.all_gather_into_tensor(self.ag_out, self.ag_in)
        dist.reduce_scatter_tensor(self.rs_out, self.rs_in)
        dist.all_to_all_single(self.a2a_out, self.a2a_in)
        dist.broadcast(self.b, 0)

    def wrong(self, rank, rnd):
        """Names of the outputs that differ from the reference for round rnd."""
        ws = self.ws
        ins = [self.inputs(r, ws, rnd) for r in range(ws)]
        want = {
            "x": sum(i["x"] for i in ins),
            "y": sum(i["y"] for i in ins),
            "ag_out": torch.cat([i["ag_in"] for i in ins]),
            "rs_out": sum(i["rs_in"][rank * N:(rank + 1) * N] for i in ins),
            "a2a_out": torch.cat([i["a2a_in"][rank * N:(rank + 1) * N] for i in ins]),
            "b": ins[0]["b"],
        }
        torch.cuda.synchronize()
        return [name for name, w in want.items() if not torch.equal(getattr(self, name).cpu(), w)]


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the error is the result
        return f"{type(e).__name__}: {e}"
    return None


def _capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    return graph


def _replays(ctx):
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    pg = _pg()
    group = dist.group.WORLD
    out = {"failures": []}
    bufs = Buffers(ws, dev)

    # Nothing ran on the device yet: a capture would have to set it up.
    bufs.fill(rank, 0)
    out["before_warmup"] = _outcome(lambda: _capture(lambda: dist.all_reduce(bufs.x)))

    # Warm-up, eager: every op once, exact.
    bufs.fill(rank, 0)
    bufs.ops()
    wrong = bufs.wrong(rank, 0)
    if wrong:
        out["failures"].append(f"eager warm-up: {wrong}")

    captured_before = int(pg._lib._captured_collective_calls(group))
    graph = _capture(bufs.ops)
    out["captured"] = int(pg._lib._captured_collective_calls(group)) - captured_before

    eager = torch.empty(N, device=dev)
    for rnd in range(1, REPLAYS + 1):
        bufs.fill(rank, rnd)
        graph.replay()
        wrong = bufs.wrong(rank, rnd)
        if wrong:
            out["failures"].append(f"replay {rnd}: {wrong}")
        if rnd % 2 == 1:
            # Eager calls between replays take the next call numbers.
            eager.fill_(float(rank + rnd))
            dist.all_reduce(eager)
            want = float(sum(r + rnd for r in range(ws)))
            if not torch.equal(eager.cpu(), torch.full((N,), want)):
                out["failures"].append(f"eager all_reduce after replay {rnd}")
    out["check"] = _outcome(lambda: pg.check_graph_replays(group))

    # Split sizes run through the host: refused under capture.
    splits = [N] * ws
    out["refused"] = _outcome(lambda: _capture(lambda: dist.all_to_all_single(
        bufs.a2a_out, bufs.a2a_in, splits, splits)))
    eager.fill_(1.0)
    dist.all_reduce(eager)
    out["after"] = sorted(set(eager.cpu().tolist()))
    return out


@pytest.mark.parametrize("world_size", world_sizes(2, 3))
def test_captured_collectives_replay_exactly(world_size):
    res = harness.run_ranks(_replays, world_size, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=ENV, pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"])
        assert r["before_warmup"] and "warm-up" in r["before_warmup"], (rank, r)
        assert r["captured"] == 6, (rank, r)
        assert r["check"] is None, (rank, r)
        assert r["refused"] and "cannot be captured in a CUDA graph" in r["refused"], (rank, r)
        assert r["after"] == [float(world_size)], (rank, r)


def _watch_follows_the_graphs(ctx):
    """Graph A holds two captured all_reduces, graph B one; the group counts
    them live until each graph is destroyed, and its worker watches replays
    only while one is."""
    import gc
    dev = use_rank_gpu(ctx.rank)
    pg = _pg()
    group = dist.group.WORLD
    live = lambda: int(pg._lib._live_graph_calls(group))  # noqa: E731
    passes = lambda: int(pg._lib._graph_watch_passes(group))  # noqa: E731
    x = torch.full((N,), float(ctx.rank + 1), device=dev)
    y = torch.full((N,), float(ctx.rank + 1), device=dev)
    dist.all_reduce(x)  # warm-up
    out = {"before": [live(), passes()]}
    graph_a = _capture(lambda: (dist.all_reduce(x), dist.all_reduce(y)))
    out["after_a"] = live()
    graph_b = _capture(lambda: dist.all_reduce(x))
    out["after_b"] = live()
    want = float(sum(r + 1 for r in range(ctx.world_size)))
    x.fill_(float(ctx.rank + 1))
    y.fill_(float(ctx.rank + 1))
    graph_a.replay()
    torch.cuda.synchronize()
    out["a"] = sorted(set(x.cpu().tolist()) | set(y.cpu().tolist())) == [want]
    first = passes()
    harness.wait_until(lambda: passes() > first, "a watch pass while graphs exist", timeout_s=10)
    del graph_a
    gc.collect()
    harness.wait_until(lambda: live() == 1, "graph A's two calls given back", timeout_s=10)
    x.fill_(float(ctx.rank + 1))
    graph_b.replay()
    torch.cuda.synchronize()
    out["b"] = sorted(set(x.cpu().tolist())) == [want]
    del graph_b
    gc.collect()
    harness.wait_until(lambda: live() == 0, "graph B's call given back", timeout_s=10)
    x.fill_(1.0)
    dist.all_reduce(x)
    out["eager"] = sorted(set(x.cpu().tolist()))
    # The worker owes one pass after the last graph went (made once it is
    # idle for a watch period), then stops.
    harness.wait_until(lambda: bool(pg._lib._graph_watch_idle(group)), "the last watch pass",
                       timeout_s=10)
    settled = passes()
    # Stopping can only be seen as nothing happening: 30 watch periods.
    time.sleep(0.3)
    out["passes_after"] = passes() - settled
    out["captured"] = int(pg._lib._captured_collective_calls(group))
    return out


def test_the_replay_watch_runs_only_while_a_graph_holds_a_captured_call():
    res = harness.run_ranks(_watch_follows_the_graphs, 2, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=ENV, pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert r["before"] == [0, 0], (rank, r)
        assert (r["after_a"], r["after_b"]) == (2, 3), (rank, r)
        assert r["a"] and r["b"], (rank, r)
        assert r["eager"] == [2.0], (rank, r)
        assert r["passes_after"] == 0, (rank, r)
        assert r["captured"] == 3, (rank, r)


def _wait_mask(pg, group, want):
    deadline = time.monotonic() + 30
    while pg.get_active_ranks(group).tolist() != want:
        assert time.monotonic() < deadline, pg.get_active_ranks(group)
        time.sleep(0.01)


def _captured_all_reduce(rank, dev):
    """x (rank + 1 everywhere), a graph of all_reduce(x) captured after one eager
    warm-up, and the distinct values of x after its first replay."""
    x = torch.full((N,), float(rank + 1), device=dev)
    dist.all_reduce(x)  # warm-up
    graph = _capture(lambda: dist.all_reduce(x))
    x.fill_(float(rank + 1))
    graph.replay()
    torch.cuda.synchronize()
    return x, graph, sorted(set(x.cpu().tolist()))


def _stale(ctx):
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    pg = _pg()
    group = dist.group.WORLD
    out = {}
    x, graph, out["first"] = _captured_all_reduce(rank, dev)

    # Rank ws-1 leaves the membership; every rank sees the new view.
    ctx.signal(f"replayed_{rank}")
    if rank == 0:
        for r in range(ws):
            ctx.wait_for(f"replayed_{r}", 60)
        pg.deactivate_ranks(group, [ws - 1])
    _wait_mask(pg, group, [1] * (ws - 1) + [0])

    x.fill_(-7.0)
    graph.replay()
    torch.cuda.synchronize()  # no hang
    out["untouched"] = sorted(set(x.cpu().tolist()))
    out["check"] = _outcome(lambda: pg.check_graph_replays(group))
    out["check_again"] = _outcome(lambda: pg.check_graph_replays(group))
    if rank < ws - 1:
        y = torch.full((4,), float(rank + 1), device=dev)
        dist.all_reduce(y)
        out["after"] = sorted(set(y.cpu().tolist()))
    return out


def test_replay_after_a_membership_change_fails_stale_touching_nothing():
    ws = 3
    res = harness.run_ranks(_stale, ws, BACKEND, timeout_s=JOB_TIMEOUT_S, ref_group=False,
                            env=ENV, pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert r["first"] == [float(sum(range(1, ws + 1)))], (rank, r)
        assert r["untouched"] == [-7.0], (rank, r)
        assert r["check"] and r["check"].startswith("DistBackendError"), (rank, r)
        assert "membership changed after the graph was captured" in r["check"], (rank, r)
        assert r["check_again"] is None, (rank, r)
        if rank < ws - 1:
            assert r["after"] == [float(sum(range(1, ws)))], (rank, r)


def _rejoin(ctx):
    """Rank 2 is deactivated; ranks 0 and 1 capture an all_reduce in their
    two-member epoch and replay it exactly; rank 2 joins back; the replay is
    then stale, and the three ranks go on eagerly."""
    dev = use_rank_gpu(ctx.rank)
    rank = ctx.rank
    pg = _pg()
    group = dist.group.WORLD
    out = {}
    x = torch.full((N,), float(rank + 1), device=dev)
    dist.all_reduce(x)  # warm-up in the three-member epoch
    if rank == 0:
        pg.deactivate_ranks(group, [2])
    _wait_mask(pg, group, [1, 1, 0])
    if rank < 2:
        y = torch.full((4,), float(rank + 1), device=dev)
        dist.all_reduce(y)  # warm-up in the two-member epoch
        graph = _capture(lambda: dist.all_reduce(x))
        x.fill_(float(rank + 1))
        graph.replay()
        torch.cuda.synchronize()
        out["two_members"] = sorted(set(x.cpu().tolist()))
        out["check_two_members"] = _outcome(lambda: pg.check_graph_replays(group))
        ctx.signal(f"captured_{rank}")
        if rank == 0:
            ctx.wait_for("captured_1", 60)
            ctx.wait_for("rejoining", 60)
            deadline = time.monotonic() + 30
            while not all(pg.get_peer_state(group, [2])):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            pg.activate_ranks(group, [2])
        _wait_mask(pg, group, [1, 1, 1])
        x.fill_(-7.0)
        graph.replay()
        torch.cuda.synchronize()  # no hang
        out["untouched"] = sorted(set(x.cpu().tolist()))
        out["check"] = _outcome(lambda: pg.check_graph_replays(group))
    else:
        ctx.wait_for("captured_0", 60)
        ctx.wait_for("captured_1", 60)
        ctx.signal("rejoining")
        pg.join_group(group)
        _wait_mask(pg, group, [1, 1, 1])
    z = torch.full((N,), float(rank + 1), device=dev)
    dist.all_reduce(z)
    out["after"] = sorted(set(z.cpu().tolist()))
    return out


def test_replay_after_a_rank_joins_back_fails_stale_touching_nothing():
    res = harness.run_ranks(_rejoin, 3, BACKEND, timeout_s=JOB_TIMEOUT_S, ref_group=False,
                            env=ENV, pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        if rank < 2:
            assert r["two_members"] == [3.0], (rank, r)
            assert r["check_two_members"] is None, (rank, r)
            assert r["untouched"] == [-7.0], (rank, r)
            assert r["check"] and r["check"].startswith("DistBackendError"), (rank, r)
            assert "membership changed after the graph was captured" in r["check"], (rank, r)
        assert r["after"] == [6.0], (rank, r)


# The test's failure must come from the host's watch of the replays, not the
# kernels' own deadline (the op timeout): well under it.
WATCHED_BOUND_S = OP_TIMEOUT_S / 4
DEAD_ENV = {**ENV, "MC_PG_RECONCILE_WINDOW_MS": "4000"}


def _dead_peer_during_replay(ctx):
    """Three ranks in the default failure mode capture an all_reduce and replay
    it exactly. Rank 2 is SIGKILLed; the survivors' next replay waits for it on
    the device. Nothing but the worker's watch of the replays can end that
    wait before the op timeout, and nothing but its report can start the
    reconciliation that takes rank 2 out: the survivors make no eager call
    until they see the new view."""
    dev = use_rank_gpu(ctx.rank)
    rank, victim = ctx.rank, 2
    pg = _pg()
    group = dist.group.WORLD
    out = {}
    x, graph, out["first"] = _captured_all_reduce(rank, dev)
    out["check_first"] = _outcome(lambda: pg.check_graph_replays(group))
    ctx.signal(f"replayed_{rank}")
    if rank == victim:
        for r in range(3):
            if r != victim:
                ctx.wait_for(f"replayed_{r}", 60)
        ctx.kill_self()
    reported_before = int(pg._lib._graph_failures_reported(group))
    x.fill_(float(rank + 1))
    t0 = time.monotonic()
    graph.replay()
    torch.cuda.synchronize()  # the kernels returned: no hang
    out["replay_s"] = time.monotonic() - t0
    out["check"] = _outcome(lambda: pg.check_graph_replays(group))
    # The reconciliation the report opened takes rank 2 out, with no eager op.
    deadline = time.monotonic() + 60
    while pg.get_active_ranks(group).tolist() != [1, 1, 0]:
        assert time.monotonic() < deadline, pg.get_active_ranks(group)
        time.sleep(0.01)
    # This rank's own report may come after the other survivor's opened it.
    while int(pg._lib._graph_failures_reported(group)) == reported_before:
        assert time.monotonic() < deadline, "no failed replay was reported"
        time.sleep(0.01)
    out["reported"] = int(pg._lib._graph_failures_reported(group)) - reported_before
    # The old graph now fails as stale (not "rank 2 failed", whatever the
    # host learnt of rank 2), touching nothing, and is no new evidence.
    x.fill_(-7.0)
    graph.replay()
    torch.cuda.synchronize()
    out["stale_untouched"] = sorted(set(x.cpu().tolist()))
    out["stale_check"] = _outcome(lambda: pg.check_graph_replays(group))
    out["reported_after_stale"] = int(pg._lib._graph_failures_reported(group)) - reported_before
    # The survivors go on: eager, then a new capture in the two-member epoch.
    y = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(y)
    out["eager_after"] = sorted(set(y.cpu().tolist()))
    graph2 = _capture(lambda: dist.all_reduce(x))
    x.fill_(float(rank + 10))
    graph2.replay()
    torch.cuda.synchronize()
    out["replay_after"] = sorted(set(x.cpu().tolist()))
    out["check_after"] = _outcome(lambda: pg.check_graph_replays(group))
    return out


def test_a_peer_killed_during_replays_is_found_by_the_host_and_taken_out():
    res = harness.run_ranks(_dead_peer_during_replay, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=DEAD_ENV, pg_timeout_s=OP_TIMEOUT_S,
                            expect_killed=[2])
    for rank in (0, 1):
        r = res[rank]
        assert r["first"] == [6.0] and r["check_first"] is None, (rank, r)
        assert r["replay_s"] < WATCHED_BOUND_S, (rank, r)
        assert r["check"] and r["check"].startswith("DistBackendError"), (rank, r)
        assert "rank 2 failed" in r["check"] and "[failed ranks: 2]" in r["check"], (rank, r)
        assert r["reported"] >= 1, (rank, r)
        assert r["stale_untouched"] == [-7.0], (rank, r)
        assert r["stale_check"] and "membership changed after the graph was captured" in \
            r["stale_check"], (rank, r)
        assert r["reported_after_stale"] == r["reported"], (rank, r)
        assert r["eager_after"] == [3.0], (rank, r)
        assert r["replay_after"] == [21.0] and r["check_after"] is None, (rank, r)


def _deactivated_while_replays_wait(ctx):
    """Rank 2 stalls (alive, never replaying); ranks 0 and 1 replay a captured
    all_reduce, whose kernels then wait for rank 2. Rank 0 deactivates rank 2
    while they wait: the waiting kernels see the committed membership change
    and fail as stale at once, not at the op timeout (a stalled peer is no
    evidence the host could put into the abort word)."""
    dev = use_rank_gpu(ctx.rank)
    rank, victim = ctx.rank, 2
    pg = _pg()
    group = dist.group.WORLD
    out = {}
    x, graph, out["first"] = _captured_all_reduce(rank, dev)
    ctx.signal(f"replayed_{rank}")
    if rank == victim:
        ctx.wait_for("survivors_done", JOB_TIMEOUT_S)
        return out
    for r in range(3):
        ctx.wait_for(f"replayed_{r}", 60)
    x.fill_(float(rank + 1))
    t0 = time.monotonic()
    graph.replay()
    # Queued, and still running (waiting for rank 2) when the change comes.
    out["busy"] = not torch.cuda.current_stream().query()
    ctx.signal(f"replaying_{rank}")
    if rank == 0:
        ctx.wait_for("replaying_1", 60)
        pg.deactivate_ranks(group, [victim])
    torch.cuda.synchronize()  # the kernels returned: no hang
    out["replay_s"] = time.monotonic() - t0
    out["untouched"] = sorted(set(x.cpu().tolist()))
    out["check"] = _outcome(lambda: pg.check_graph_replays(group))
    _wait_mask(pg, group, [1, 1, 0])
    y = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(y)
    out["eager_after"] = sorted(set(y.cpu().tolist()))
    ctx.signal(f"done_{rank}")
    if rank == 0:
        ctx.wait_for("done_1", 60)
        ctx.signal("survivors_done")
    return out


def test_replays_waiting_when_a_member_is_deactivated_fail_stale_at_once():
    res = harness.run_ranks(_deactivated_while_replays_wait, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=ENV, pg_timeout_s=OP_TIMEOUT_S)
    for rank in (0, 1):
        r = res[rank]
        assert r["first"] == [6.0], (rank, r)
        assert r["busy"], (rank, r)
        assert r["replay_s"] < WATCHED_BOUND_S, (rank, r)
        assert r["untouched"] == [float(rank + 1)], (rank, r)
        assert r["check"] and "membership changed after the graph was captured" in r["check"], \
            (rank, r)
        assert r["eager_after"] == [3.0], (rank, r)
