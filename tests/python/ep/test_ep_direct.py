"""Direct FP8 dispatch on the fast path, N processes on one GPU.

On by default; MC_EP_DIRECT_DISPATCH=0 turns it off (the tests set it per rank).

Senders reserve rows on the owner's per-expert counter and write them in place
into a packed FP8 slot of its buffer; recv_x is a view of that slot, which
serves no other op until the views are freed (docs/ep-guide.md, "Direct FP8
dispatch"). Checked here: the size hint grows
by the area; FP8 rounds (every sync mode, zero_copy, a rank preset inactive)
interleaved with BF16 rounds (which keep the copying receive) so both halves
of the buffer and both kinds of op follow each other, with the exact checks
of ep_checks.run_round (rows are compared per source through layout_range,
so arrival order does not matter); FP8 outputs lying in the buffer; outputs
held across later dispatches unchanged (a slot is not reused while a view
of it lives); no rank runs direct when one rank did not ask for it, nor in
a buffer without the slots (the minimum size), where FP8 rounds stay exact.

Without a GPU or the compiled runtime every test skips and says why.
"""

import itertools
import os

import pytest
import torch
import torch.distributed as dist

import harness
from ep_checks import SYNC_MODES, check_dispatch, gather_topk, make_inputs, run_round
from gpu_ranks import use_rank_gpu, world_sizes
from mooncake import _ep_fast, _ep_runtime
from mooncake.mooncake_ep_buffer import Buffer

DIRECT_ENV = _ep_fast.DIRECT_DISPATCH_ENV


def _skip_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: direct dispatch runs CUDA kernels over cuda_ipc"
    return _ep_runtime.unavailable_reason("cuda")


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _hint(world, direct):
    os.environ[DIRECT_ENV] = "1" if direct else "0"
    return Buffer.get_ep_buffer_size_hint(8, 256, world, 3 * world)


def _inside(tensor, buf):
    base = buf._fast.local_address()
    return base <= tensor.data_ptr() < base + buf.num_ep_buffer_bytes


def _direct_worker(ctx, direct_ranks, with_slots=True):
    world, rank = ctx.world_size, ctx.rank
    use_rank_gpu(rank)
    plain = _hint(world, direct=False)
    with_area = _hint(world, direct=True)
    # 3 local experts x (world * 8) rows x 256 channels, three slots: the FP8
    # rows alone take 3 * 3 * 8 * world * 256 bytes more.
    assert with_area - plain >= 3 * 3 * 8 * world * 256, (plain, with_area)
    os.environ[DIRECT_ENV] = "1" if rank in direct_ranks else "0"
    # The same size on every rank; without the slots (the minimum a buffer
    # may have) every op takes the copying receive.
    buf = Buffer(dist.group.WORLD, with_area if with_slots else plain)
    assert buf.use_fast_path, f"rank {rank}: fast path off: {buf.fast_path_reason}"
    all_active = [1] * world
    one_down = [1] * world
    one_down[world - 1] = 0
    diffs = []
    # FP8 and BF16 alternate irregularly, so either kind of op follows
    # either in both halves of the buffer.
    kinds = (True, True, False, True, False, False, True)
    cases = itertools.product(SYNC_MODES, (False, True), (all_active, one_down))
    for seed, ((mode, zero_copy, active), use_fp8) in enumerate(
            zip(cases, itertools.cycle(kinds))):
        ctx.note(f"case {seed}: fp8={use_fp8} {mode} zero_copy={zero_copy} active={active}")
        diffs.append(run_round(ctx, buf, 900 + seed, use_fp8, mode, active, "cuda",
                               zero_copy=zero_copy, timeout_us=30_000_000))

    # Where this rank's FP8 outputs live: in its buffer when it runs direct.
    x, idx, _ = make_inputs(rank, 8 - rank % 2, 256, 3 * world, 4, seed=99)
    all_topk = gather_topk(idx, 8, ctx.ref)
    act = torch.ones(world, dtype=torch.int32, device="cuda")
    recv, count, handle, _, _ = buf.dispatch(x.cuda(), idx.cuda(), act, 8, 3 * world, 30_000_000,
                                             use_fp8=True)
    torch.cuda.synchronize()
    direct = len(direct_ranks) == world and with_slots  # every rank asked, and room for it
    assert _inside(recv[0], buf) == direct, f"rank {rank}: recv_x data in the buffer"
    assert _inside(recv[1], buf) == direct, f"rank {rank}: scales in the buffer"
    check_dispatch(rank, world, (recv[0].cpu(), recv[1].cpu()), count.cpu(),
                   (handle[0].cpu(), handle[1].cpu()), all_topk, [1] * world, 3 * world, 8, 256,
                   True, f"rank {rank} last direct={direct}")

    # Outputs held across later dispatches stay as they were: a slot is not
    # named again while a view of it lives, and with every slot held an op
    # gets tensors of its own.
    held = []
    for k in range(5):
        x, idx, _ = make_inputs(rank, 8 - rank % 2, 256, 3 * world, 4, seed=120 + k)
        recv, count, handle, _, _ = buf.dispatch(x.cuda(), idx.cuda(), act, 8, 3 * world,
                                                 30_000_000, use_fp8=True)
        torch.cuda.synchronize()
        held.append((recv, handle, recv[0].view(torch.uint8).cpu(), recv[1].cpu(),
                     handle[0].cpu()))
    for k in range(5):  # more traffic through the slots while they are held
        diffs.append(run_round(ctx, buf, 140 + k, True, "sync", all_active, "cuda",
                               timeout_us=30_000_000))
    inside = 0
    for k, (recv, handle, data, scales, src_info) in enumerate(held):
        assert torch.equal(recv[0].view(torch.uint8).cpu(), data), f"rank {rank}: held op {k} rows"
        assert torch.equal(recv[1].cpu(), scales), f"rank {rank}: held op {k} scales"
        assert torch.equal(handle[0].cpu(), src_info), f"rank {rank}: held op {k} src_info"
        inside += _inside(recv[0], buf)
    assert inside <= 3 and (inside >= 1) == direct, f"rank {rank}: {inside} held ops in slots"
    return max(diffs)


def _all_direct(ctx):
    return _direct_worker(ctx, direct_ranks=range(ctx.world_size))


def _all_but_rank0(ctx):
    return _direct_worker(ctx, direct_ranks=range(1, ctx.world_size))


@pytest.mark.parametrize("world_size", world_sizes(2, 4))
def test_direct_dispatch(world_size):
    results = harness.run_ranks(_all_direct, world_size, "mooncake-cpu", timeout_s=150)
    assert all(d < 1e-5 for d in results), results


def test_direct_needs_every_rank():
    results = harness.run_ranks(_all_but_rank0, 3, "mooncake-cpu", timeout_s=150)
    assert all(d < 1e-5 for d in results), results


def _all_asking_without_slots(ctx):
    return _direct_worker(ctx, direct_ranks=range(ctx.world_size), with_slots=False)


def test_direct_needs_the_slots():
    results = harness.run_ranks(_all_asking_without_slots, 2, "mooncake-cpu", timeout_s=150)
    assert all(d < 1e-5 for d in results), results
