"""The EP fallback grid in DeepEP's exact-check style, over mooncake-cpu and gloo groups.

fp8 x {sync, async_finish, return_recv_hook} x {all active, one inactive rank},
each round with -1 top-k entries and a different token count per rank, then
zero_copy (NotImplementedError on the fallback), two dispatches in flight and
a larger shape. One spawned job per (backend, world size) runs every case
(process start and the torch import dominate the cost).
"""

import itertools

import pytest
import torch
import torch.distributed as dist

import harness
from ep_checks import (SYNC_MODES, check_combine, check_dispatch, combine_reference,
                       gather_topk, make_inputs, new_buffer, run_round)
from mooncake.mooncake_ep_buffer import FORCE_FALLBACK_ENV

# On a machine with the CUDA runtime a Buffer would take the fast path for
# CUDA data; this suite is about the fallback (test_ep_fast.py has the other).
FALLBACK_ENV = {FORCE_FALLBACK_ENV: "1"}


def _grid_worker(ctx, device="cpu"):
    if device == "cuda":
        torch.cuda.set_device(ctx.rank % torch.cuda.device_count())
    world, rank = ctx.world_size, ctx.rank
    buf = new_buffer(dist.group.WORLD, 8, 256, world, 3 * world)
    assert buf.use_fast_path is False and FORCE_FALLBACK_ENV in buf.fast_path_reason
    all_active = [1] * world
    one_down = [1] * world
    one_down[world - 1] = 0
    diffs = []
    for seed, (use_fp8, mode, active) in enumerate(
            itertools.product((False, True), SYNC_MODES, (all_active, one_down))):
        ctx.note(f"case {seed}: fp8={use_fp8} {mode} active={active}")
        diffs.append(run_round(ctx, buf, seed, use_fp8, mode, active, device))

    # Two dispatches in flight, combined in order: each handle keeps its own route.
    num_experts = 3 * world
    act = torch.ones(world, dtype=torch.int32)
    rounds = []
    for seed in (100, 101):
        x, idx, w = make_inputs(rank, 8, 256, num_experts, 4, seed)
        recv, _, handle, _, _ = buf.dispatch(x, idx, act, 8, num_experts, -1, use_fp8=False)
        rounds.append((x, idx, w, recv, handle))
    for x, idx, w, recv, handle in rounds:
        out, _, _ = buf.combine(recv, idx, w, act, -1, handle)
        diffs.append(check_combine(out, combine_reference(rank, x, idx, w, [1] * world, 3),
                                   False, "two in flight"))

    # A rank marked inactive between dispatch and combine (as a timeout would):
    # combine must drop its experts' outputs although their rows came back.
    x, idx, w = make_inputs(rank, 8, 256, num_experts, 4, 102)
    act = torch.ones(world, dtype=torch.int32)
    recv, _, handle, _, _ = buf.dispatch(x, idx, act, 8, num_experts, -1, use_fp8=False)
    act[world - 1] = 0
    out, _, _ = buf.combine(recv, idx, w, act, -1, handle)
    diffs.append(check_combine(out, combine_reference(rank, x, idx, w, one_down, 3, sent=False),
                               False, "marked inactive after dispatch"))
    act[world - 1] = 1

    # Views differ: only rank 0 sees the last rank as inactive. Rank 0 must drop
    # the rows the last rank still sends it, and not send it any.
    views = [one_down] + [all_active] * (world - 1)
    x, idx, w = make_inputs(rank, 8, 256, num_experts, 4, 103)
    all_topk = gather_topk(idx, 8, ctx.ref)
    act = torch.tensor(views[rank], dtype=torch.int32)
    recv, count, handle, _, _ = buf.dispatch(x, idx, act, 8, num_experts, -1, use_fp8=False)
    check_dispatch(rank, world, recv, count, handle, all_topk, views[rank], num_experts, 8, 256,
                   False, "views differ", views=views)
    out, _, _ = buf.combine(recv, idx, w, act, -1, handle)
    if rank != world - 1:  # the last rank loses rank 0's experts: rank 0 treats it as gone
        diffs.append(check_combine(out, combine_reference(rank, x, idx, w, views[rank], 3), False,
                                   "views differ"))
    act = torch.ones(world, dtype=torch.int32)

    # A Kimi-like width and top-8 over a second buffer, with out= supplied.
    big = new_buffer(dist.group.WORLD, 16, 1024, world, 8 * world)
    x, idx, w = make_inputs(rank, 16, 1024, 8 * world, 8, 7)
    for use_fp8 in (False, True):
        all_topk = gather_topk(idx, 16, ctx.ref)
        recv, count, handle, _, _ = big.dispatch(x, idx, act, 16, 8 * world, 5_000_000,
                                                 use_fp8=use_fp8)
        data = check_dispatch(rank, world, recv, count, handle, all_topk, [1] * world, 8 * world,
                              16, 1024, use_fp8, f"big fp8={use_fp8}")
        out = torch.empty(16, 1024, dtype=torch.bfloat16)
        combined, _, _ = big.combine(data, idx, w, act, 5_000_000, handle, out=out)
        assert combined is out
        diffs.append(check_combine(out, combine_reference(rank, x, idx, w, [1] * world, 8),
                                   use_fp8, f"big fp8={use_fp8}"))
    if world == 4:
        # A Buffer per subgroup: EP ranks are group ranks, collectives stay in the group.
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        sub = pairs[rank // 2]
        sub_buf = new_buffer(sub, 8, 256, 2, 4)
        assert (sub_buf.rank, sub_buf.group_size) == (rank % 2, 2)
        x, idx, w = make_inputs(rank, 8, 256, 4, 2, 200)
        act2 = torch.ones(2, dtype=torch.int32)
        recv, count, handle, _, _ = sub_buf.dispatch(x, idx, act2, 8, 4, -1, use_fp8=True)
        # Rows carry rank - 128 of the global rank: both sources are in this pair.
        srcs = set()
        for le in range(2):
            rows = recv[0][le, : int(count[le])].float() * recv[1][le, : int(count[le]), :1]
            srcs |= set((rows[:, 0] + 128).long().tolist())
        assert srcs <= {rank - rank % 2, rank - rank % 2 + 1}, srcs
        from mooncake.mooncake_ep_buffer import fp8_dequantize
        out, _, _ = sub_buf.combine(fp8_dequantize(*recv), idx, w, act2, -1, handle)
        diffs.append(check_combine(out, combine_reference(rank % 2, x, idx, w, [1, 1], 2), True,
                                   "subgroup"))
    return max(diffs)


@pytest.mark.parametrize("world_size", [2, 4])
def test_fallback_grid(backend, world_size):
    results = harness.run_ranks(_grid_worker, world_size, backend, timeout_s=240, env=FALLBACK_ENV)
    # Constant rows survive FP8 exactly, so every diff is BF16 output rounding only.
    assert all(d < 1e-5 for d in results), results


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs CUDA: the fallback with CUDA tensors over a CPU-collective group")
def test_fallback_grid_cuda_tensors(backend):
    # Two ranks may share one GPU: mooncake-cpu and gloo stage the rows through the host.
    results = harness.run_ranks(_grid_worker, 2, backend, timeout_s=300, args=("cuda",),
                                env=FALLBACK_ENV)
    assert all(d < 1e-5 for d in results), results
