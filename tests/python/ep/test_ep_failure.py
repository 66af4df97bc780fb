"""A rank that stops calling EP ops: the fallback's timeout and failed-rank handling.

* timeout_us bounds the wait: the caller gets a RuntimeError naming timeout_us
  and active_ranks is untouched (no backend evidence yet). The late rank then
  posts the matching collective, and both go on with an exact round: the
  buffer and the group stay usable.
* On mooncake-cpu a collective that fails at the group timeout comes with
  failed_ranks_hint: the survivor gets EPRankFailure naming the rank and finds
  it set to 0 in active_ranks.
"""

import pytest
import torch
import torch.distributed as dist

import harness
from ep_checks import check_combine, combine_reference, make_inputs, new_buffer
from mooncake.mooncake_ep_buffer import EPRankFailure

M, H, K = 4, 128, 2


def _timeout_worker(ctx):
    world, rank = ctx.world_size, ctx.rank
    E = 2 * world
    buf = new_buffer(dist.group.WORLD, M, H, world, E)
    x, idx, w = make_inputs(rank, M, H, E, K, seed=9)
    act = torch.ones(world, dtype=torch.int32)
    if rank == 0:
        with pytest.raises(RuntimeError, match=r"the count all_to_all on the \S+ group did not "
                                               r"complete \(timeout_us=300000\)"):
            buf.dispatch(x, idx, act, M, E, timeout_us=300_000, use_fp8=False)
        assert act.tolist() == [1] * world
        ctx.signal("timed_out")
    else:
        ctx.wait_for("timed_out", 120)
        # The collective rank 0 is still in: post its match so both are in step again.
        counts = torch.zeros(E, dtype=torch.int64)
        dist.all_to_all_single(torch.empty_like(counts), counts)
    recv, _, handle, _, _ = buf.dispatch(x, idx, act, M, E, timeout_us=30_000_000, use_fp8=True)
    from mooncake.mooncake_ep_buffer import fp8_dequantize
    out, _, _ = buf.combine(fp8_dequantize(*recv), idx, w, act, 30_000_000, handle)
    return check_combine(out, combine_reference(rank, x, idx, w, [1] * world, 2), True, "after")


def test_timeout_raises_and_the_buffer_stays_usable(backend):
    results = harness.run_ranks(_timeout_worker, 2, backend, timeout_s=180)
    assert all(d < 1e-5 for d in results), results


def _dead_rank_worker(ctx):
    world, rank = ctx.world_size, ctx.rank
    E = 2 * world
    buf = new_buffer(dist.group.WORLD, M, H, world, E)
    x, idx, _ = make_inputs(rank, M, H, E, K, seed=10)
    act = torch.ones(world, dtype=torch.int32)
    if rank == world - 1:
        ctx.wait_for("survivors_done", 120)  # alive, but never calls dispatch
        return None
    try:
        buf.dispatch(x, idx, act, M, E, timeout_us=-1, use_fp8=False)
    except EPRankFailure as e:
        failed = e.failed_ranks
    else:
        raise AssertionError("dispatch with a silent rank succeeded")
    ctx.signal("survivors_done")
    return failed, act.tolist()


def test_silent_rank_is_marked_inactive_on_mooncake_cpu():
    err = harness.backend_import_error("mooncake-cpu")
    if err is not None:
        pytest.fail(f"mooncake-cpu is not available: {err}", pytrace=False)
    env = {"MC_PG_TIMEOUT_MS": "2000", "MC_PG_RECONCILE_WINDOW_MS": "3000"}
    results = harness.run_ranks(_dead_rank_worker, 3, "mooncake-cpu", timeout_s=180, env=env)
    assert results[:2] == [([2], [1, 1, 0])] * 2, results
