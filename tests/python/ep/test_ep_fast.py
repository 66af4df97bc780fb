"""The EP fast path (CUDA kernels over cuda_ipc) as N processes on one GPU.

Seed 000's grid on the fast path, with the fallback grid's checks
(ep_checks.run_round): fp8 x {sync, async_finish, return_recv_hook} x
zero_copy x {all active, one rank preset inactive} at 2 and 4 processes over a
mooncake-cpu control group, and fail_rank=1 (rank 1 leaves with os._exit;
survivors with a 2 s timeout see active_ranks[1] == 0 and get the remaining
experts' output) at 2 and 4 over gloo; one 8-process case. Then the fast
path's results against the fallback's on the same random inputs, CUDA graph
capture + replay, CPU data on a fast-path Buffer, the device error word for
out-of-range expert ids, and handle checks after update_ep_member().

Without a GPU or the compiled runtime every test skips and says why.
"""

import itertools
import os

import pytest
import torch
import torch.distributed as dist

import harness
from ep_checks import (SYNC_MODES, calc_diff, check_combine, check_dispatch, combine_reference,
                       gather_topk, make_inputs, new_buffer, rows_by_source, run_round)
from gpu_ranks import use_rank_gpu, world_sizes
from mooncake import _ep_fast, _ep_runtime
from mooncake.mooncake_ep_buffer import FORCE_FALLBACK_ENV, fp8_dequantize


def _skip_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: the fast path runs CUDA kernels over cuda_ipc"
    return _ep_runtime.unavailable_reason("cuda")


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

FAIL_TIMEOUT_US = 2_000_000


def _fast_buffer(ctx, max_tokens=8, hidden=256, num_experts=None):
    use_rank_gpu(ctx.rank)
    world = ctx.world_size
    buf = new_buffer(dist.group.WORLD, max_tokens, hidden, world, num_experts or 3 * world)
    assert buf.use_fast_path, f"rank {ctx.rank}: fast path off: {buf.fast_path_reason}"
    assert buf.ibgda_peers == [], "one host: every peer over cuda_ipc"
    return buf


def _grid_worker(ctx):
    world = ctx.world_size
    buf = _fast_buffer(ctx)
    all_active = [1] * world
    one_down = [1] * world
    one_down[world - 1] = 0
    diffs = []
    for seed, (use_fp8, mode, zero_copy, active) in enumerate(itertools.product(
            (False, True), SYNC_MODES, (False, True), (all_active, one_down))):
        ctx.note(f"case {seed}: fp8={use_fp8} {mode} zero_copy={zero_copy} active={active}")
        diffs.append(run_round(ctx, buf, seed, use_fp8, mode, active, "cuda",
                               zero_copy=zero_copy, timeout_us=30_000_000))
    diffs += _parity_with_fallback(ctx, buf)
    diffs += _graph_replay(ctx)
    diffs.append(_cpu_data_uses_the_fallback(ctx, buf))
    diffs.append(_bad_expert_ids(ctx, buf))
    diffs.append(_phase_trace(ctx, buf))
    diffs.append(_misaligned_rows(ctx, buf))
    _handles_after_update(ctx, buf)
    return max(diffs)


@pytest.mark.parametrize("world_size", world_sizes(2, 4))
def test_fast_grid(world_size):
    results = harness.run_ranks(_grid_worker, world_size, "mooncake-cpu", timeout_s=150)
    assert all(d < 1e-5 for d in results), results


def _parity_with_fallback(ctx, buf):
    """Same random inputs through both paths: identical dispatch outputs, equal combine."""
    world, rank = ctx.world_size, ctx.rank
    os.environ[FORCE_FALLBACK_ENV] = "1"
    try:
        slow = new_buffer(dist.group.WORLD, 8, 256, world, 3 * world)
    finally:
        os.environ.pop(FORCE_FALLBACK_ENV)
    assert not slow.use_fast_path
    gen = torch.Generator().manual_seed(77 + rank)
    x = torch.randn(7, 256, generator=gen).to(torch.bfloat16).cuda()
    _, idx, w = make_inputs(rank, 7, 256, 3 * world, 4, seed=55)
    idx, w = idx.cuda(), w.cuda()
    diffs = []
    for use_fp8 in (False, True):
        label = f"rank {rank} parity fp8={use_fp8}"
        outs = []
        for b in (buf, slow):
            act = torch.ones(world, dtype=torch.int32, device="cuda")
            recv, count, handle, _, _ = b.dispatch(x, idx, act, 8, 3 * world, -1, use_fp8=use_fp8)
            data = fp8_dequantize(*recv) if use_fp8 else recv
            expert_out = (data.float() * 0.5 + 1.0).to(torch.bfloat16)
            out, _, _ = b.combine(expert_out, idx, w, act, -1, handle)
            torch.cuda.synchronize()
            outs.append((recv, count, handle, out))
        (rf, cf, hf, of), (rs, cs, hs, os_) = outs
        assert torch.equal(cf, cs), f"{label}: recv_count {cf.tolist()} vs {cs.tolist()}"
        if not (use_fp8 and _ep_fast.direct_dispatch_requested()):
            # Source-rank order; a direct dispatch packs sources in arrival order.
            assert torch.equal(hf[1], hs[1]), f"{label}: layout_range differs"
        for le in range(3):
            fast_rows = rows_by_source(rf, hf, le, use_fp8)
            slow_rows = rows_by_source(rs, hs, le, use_fp8)
            assert fast_rows.keys() == slow_rows.keys(), f"{label}: (source, token) rows of {le}"
            for key, (data, scales) in fast_rows.items():
                assert torch.equal(data, slow_rows[key][0]), f"{label}: row {key} of {le}"
                if use_fp8:
                    assert torch.equal(scales, slow_rows[key][1]), f"{label}: scales {key} of {le}"
        # Both reduce in FP32; only the order of additions may differ (last-bit BF16).
        diff = calc_diff(of, os_)
        assert diff < 1e-6, f"{label}: combine calc_diff {diff:.3g} between the paths"
        diffs.append(diff)
    return diffs


def _graph_replay(ctx):
    """One captured dispatch + combine step, replayed with new inputs each time."""
    world, rank = ctx.world_size, ctx.rank
    E, M, H = 2 * world, 8, 256
    buf = new_buffer(dist.group.WORLD, M, H, world, E)
    x0, idx0, w0 = make_inputs(rank, M, H, E, 2, seed=300)
    x, idx, w = x0.cuda(), idx0.cuda(), w0.cuda()
    act = torch.ones(world, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, count, handle, _, _ = buf.dispatch(x, idx, act, M, E, 5_000_000, use_fp8=False)
        out, _, _ = buf.combine(recv, idx, w, act, 5_000_000, handle)
    diffs = []
    for it in range(3):
        xi, idxi, wi = make_inputs(rank, M, H, E, 2, seed=301 + it)
        x.copy_(xi)
        idx.copy_(idxi)
        w.copy_(wi)
        all_topk = gather_topk(idxi, M, ctx.ref)
        graph.replay()
        torch.cuda.synchronize()
        label = f"rank {rank} graph replay {it}"
        check_dispatch(rank, world, recv.cpu(), count.cpu(), (handle[0].cpu(), handle[1].cpu()),
                       all_topk, [1] * world, E, M, H, False, label)
        diffs.append(check_combine(out.cpu(), combine_reference(rank, xi, idxi, wi, [1] * world, 2),
                                   False, label))
    # This Buffer never handed out a combine buffer: zero_copy has nothing to read.
    recv, _, handle, _, _ = buf.dispatch(x, idx, act, M, E, 5_000_000, use_fp8=False)
    with pytest.raises(ValueError, match="was not called for shape"):
        buf.combine(recv, idx, w, act, 5_000_000, handle, zero_copy=True)
    buf.combine(recv, idx, w, act, 5_000_000, handle)
    torch.cuda.synchronize()
    return diffs


def _phase_trace(ctx, buf):
    """A traced round is as exact as an untraced one and marks every kernel;
    bad trace tensors and a traced capture are refused."""
    world = ctx.world_size
    layout = _ep_runtime.runtime().phase_trace_layout()
    for bad, what in ((torch.zeros(layout["slots"], dtype=torch.int32, device="cuda"), "int32"),
                      (torch.zeros(layout["slots"] - 1, dtype=torch.int64, device="cuda"), "elements"),
                      (torch.zeros(layout["slots"], dtype=torch.int64), "on cpu")):
        with pytest.raises(ValueError, match=what):
            buf._fast.set_phase_trace(bad)
    trace = torch.zeros(layout["slots"], dtype=torch.int64, device="cuda")
    buf._fast.set_phase_trace(trace)
    try:
        diff = run_round(ctx, buf, 900, True, "sync", [1] * world, "cuda", timeout_us=30_000_000)
        torch.cuda.synchronize()
        marks = trace.view(len(layout["kernels"]), layout["max_blocks"], len(layout["marks"]))
        for k, name in enumerate(layout["kernels"]):
            starts = marks[k, :, 0]
            assert int(starts[0]) > 0, f"rank {ctx.rank}: {name} block 0 wrote no start"
            ends = marks[k, :, 2][starts != 0]
            assert bool((ends >= starts[starts != 0]).all()), f"rank {ctx.rank}: {name} ends early"
        x, idx, w = make_inputs(ctx.rank, 8, 256, 3 * world, 4, seed=901)
        x, idx = x.cuda(), idx.cuda()  # a copy from the host cannot be captured
        act = torch.ones(world, dtype=torch.int32, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(ValueError, match="cannot be captured"):
            with torch.cuda.graph(graph):
                buf.dispatch(x, idx, act, 8, 3 * world, -1, use_fp8=False)
    finally:
        buf._fast.set_phase_trace(None)
    return diff


def _cpu_data_uses_the_fallback(ctx, buf):
    world = ctx.world_size
    x, idx, w = make_inputs(ctx.rank, 8, 256, 3 * world, 4, seed=400)
    act = torch.ones(world, dtype=torch.int32)
    recv, _, handle, _, _ = buf.dispatch(x, idx, act, 8, 3 * world, -1, use_fp8=False)
    with pytest.raises(NotImplementedError, match="its x was not a CUDA tensor"):
        buf.get_next_combine_buffer(handle)
    out, _, _ = buf.combine(recv, idx, w, act, -1, handle)
    return check_combine(out, combine_reference(ctx.rank, x, idx, w, [1] * world, 3), False,
                         "cpu data on a fast-path buffer")


def _bad_expert_ids(ctx, buf):
    """Rank 0 routes to expert E+5: the entry is skipped and the device error word is
    reported at rank 0's next host point (here: the combine after a synchronize)."""
    world, rank = ctx.world_size, ctx.rank
    E = 3 * world
    x, idx, w = make_inputs(rank, 8, 256, E, 4, seed=500)
    if rank == 0:
        idx[0, 0] = E + 5
    all_topk = gather_topk(idx, 8, ctx.ref)  # E + 5 matches no expert: never expected
    act = torch.ones(world, dtype=torch.int32, device="cuda")
    idx_dev = idx.cuda()
    recv, count, handle, _, _ = buf.dispatch(x.cuda(), idx_dev, act, 8, E, 30_000_000,
                                             use_fp8=False)
    torch.cuda.synchronize()  # the error word's copy has landed: the next call must see it
    check_dispatch(rank, world, recv.cpu(), count.cpu(), (handle[0].cpu(), handle[1].cpu()),
                   all_topk, [1] * world, E, 8, 256, False, f"rank {rank} bad expert id")
    if rank == 0:
        with pytest.raises(RuntimeError, match=rf"outside \[-1, num_experts\) \(value {E + 5}\)"):
            buf.combine(recv, idx_dev, w.cuda(), act, 30_000_000, handle)
    # No rank combined that dispatch (rank 0's call raised before launching).
    dist.barrier(group=ctx.ref)
    # Cleared: the next round on every rank is exact.
    return run_round(ctx, buf, 501, True, "sync", [1] * world, "cuda", timeout_us=30_000_000)


def _odd_offset_view(t):
    """A contiguous copy of t that starts one element (2 bytes) past an aligned address."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    view = flat.view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.data_ptr() % 16 == 2
    return view


def _misaligned_rows(ctx, buf):
    """The kernels move rows in 16-byte words: x and out views at an odd element offset are
    refused before any launch (every rank refuses its own), and the buffer goes on exact."""
    world = ctx.world_size
    E = 3 * world
    x, idx, w = make_inputs(ctx.rank, 8, 256, E, 4, seed=700)
    x, idx, w = x.cuda(), idx.cuda(), w.cuda()
    act = torch.ones(world, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="x starts 2 bytes past a 16-byte boundary"):
        buf.dispatch(_odd_offset_view(x), idx, act, 8, E, 30_000_000, use_fp8=False)
    recv, _, handle, _, _ = buf.dispatch(x, idx, act, 8, E, 30_000_000, use_fp8=False)
    with pytest.raises(ValueError, match="out starts 2 bytes past a 16-byte boundary"):
        buf.combine(recv, idx, w, act, 30_000_000, handle, out=_odd_offset_view(x))
    with pytest.raises(ValueError, match=r"x \(expert outputs\) starts 2 bytes past"):
        buf.combine(_odd_offset_view(recv), idx, w, act, 30_000_000, handle)
    out, _, _ = buf.combine(recv, idx, w, act, 30_000_000, handle)
    diff = check_combine(out.cpu(), combine_reference(ctx.rank, x.cpu(), idx.cpu(), w.cpu(),
                                                      [1] * world, 3), False,
                         f"rank {ctx.rank} after refused misaligned rows")
    return max(diff, run_round(ctx, buf, 701, True, "sync", [1] * world, "cuda",
                               timeout_us=30_000_000))


def _handles_after_update(ctx, buf):
    world = ctx.world_size
    x, idx, w = make_inputs(ctx.rank, 8, 256, 3 * world, 4, seed=600)
    x, idx, w = x.cuda(), idx.cuda(), w.cuda()
    act = torch.ones(world, dtype=torch.int32, device="cuda")
    recv, _, handle, _, _ = buf.dispatch(x, idx, act, 8, 3 * world, 30_000_000, use_fp8=False)
    # Host-side rejections, before anything is launched.
    altered = (handle[0].clone(),) + handle[1:]
    with pytest.raises(ValueError, match="was altered"):
        buf.combine(recv, idx, w, act, 30_000_000, altered)
    buf.combine(recv, idx, w, act, 30_000_000, handle)
    torch.cuda.synchronize()
    buf.update_ep_member()
    assert buf.use_fast_path, buf.fast_path_reason
    with pytest.raises(ValueError, match=r"predates update_ep_member\(\)"):
        buf.combine(recv, idx, w, act, 30_000_000, handle)
    other = new_buffer(dist.group.WORLD, 8, 256, world, 3 * world)
    with pytest.raises(ValueError, match="comes from another Buffer"):
        other.combine(recv, idx, w, act, 30_000_000, handle)
    run_round(ctx, buf, 601, False, "async_finish", [1] * world, "cuda", zero_copy=True,
              timeout_us=30_000_000)


def _fail_worker(ctx):
    """Rank 1 leaves after setup; survivors time out on it and carry on without it."""
    world, rank = ctx.world_size, ctx.rank
    buf = _fast_buffer(ctx)
    dist.barrier(group=ctx.ref)
    if rank == 1:
        harness._write_result(harness._paths(ctx.tmpdir, rank)["result"],
                              {"status": "ok", "value": "left"})
        os._exit(0)
    diffs = []
    cases = [(fp8, mode, zc) for fp8 in (False, True) for mode, zc in
             (("sync", False), ("async_finish", True), ("return_recv_hook", False))]
    for seed, (use_fp8, mode, zero_copy) in enumerate(cases):
        ctx.note(f"fail case {seed}: fp8={use_fp8} {mode} zero_copy={zero_copy}")
        diffs.append(run_round(ctx, buf, 700 + seed, use_fp8, mode, [1] * world, "cuda",
                               zero_copy=zero_copy, timeout_us=FAIL_TIMEOUT_US, gone=(1,)))
    return max(diffs)


@pytest.mark.parametrize("world_size", [2, 4])
def test_fast_rank_leaves(world_size):
    results = harness.run_ranks(_fail_worker, world_size, "gloo", timeout_s=100)
    assert results[1] == "left", results
    assert all(d < 1e-5 for i, d in enumerate(results) if i != 1), results


def _eight_worker(ctx):
    buf = _fast_buffer(ctx, max_tokens=16, hidden=1024, num_experts=64)
    diffs = []
    for seed, use_fp8 in enumerate((False, True)):
        diffs.append(run_round(ctx, buf, 800 + seed, use_fp8, "sync", [1] * 8, "cuda",
                               zero_copy=use_fp8, timeout_us=30_000_000, max_tokens=16,
                               hidden=1024, experts_per_rank=8, top_k=8))
    return max(diffs)


def test_fast_eight_processes():
    results = harness.run_ranks(_eight_worker, 8, "mooncake-cpu", timeout_s=150)
    assert all(d < 1e-5 for d in results), results
