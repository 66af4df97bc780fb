"""Every bad argument of Buffer/dispatch/combine raises its error, naming the value.

All ranks pass the same bad input, so every rank raises before any collective;
afterwards a valid round still gives exact results (no state was corrupted).
One spawned job per backend runs every case.
"""

import re

import torch
import torch.distributed as dist

import harness
from ep_checks import check_combine, combine_reference, make_inputs, new_buffer
from mooncake import _ep_fast
from mooncake.mooncake_ep_buffer import Buffer

M, H, K = 8, 256, 4


def _expect(failures, label, exc_type, pattern, fn):
    try:
        fn()
    except exc_type as e:
        if not re.search(pattern, str(e)):
            failures.append(f"{label}: message {str(e)!r} does not match {pattern!r}")
        return
    except Exception as e:  # noqa: BLE001 - reported with its type
        failures.append(f"{label}: raised {type(e).__name__}: {e}; expected {exc_type.__name__}")
        return
    failures.append(f"{label}: no error; expected {exc_type.__name__} matching {pattern!r}")


def _bad_input_worker(ctx):
    world, rank = ctx.world_size, ctx.rank
    E = 2 * world
    group = dist.group.WORLD
    buf = new_buffer(group, M, H, world, E)
    x, idx, w = make_inputs(rank, M, H, E, K, seed=3)
    act = torch.ones(world, dtype=torch.int32)
    f = []

    def dispatch(**kw):
        args = dict(x=x, topk_idx=idx, active_ranks=act, num_max_dispatch_tokens_per_rank=M,
                    num_experts=E, timeout_us=-1, use_fp8=False)
        args.update(kw)
        return buf.dispatch(**args)

    # x
    _expect(f, "x float32", TypeError, r"x must be torch\.bfloat16, got torch\.float32",
            lambda: dispatch(x=x.float()))
    _expect(f, "x 3-D", ValueError, r"x must be 2-D .*got shape \(1, 8, 256\)",
            lambda: dispatch(x=x.view(1, M, H)))
    wide = torch.zeros(M, 2 * H, dtype=torch.bfloat16)
    _expect(f, "x strided", ValueError, r"x must be contiguous", lambda: dispatch(x=wide[:, ::2]))
    _expect(f, "hidden 192", ValueError, r"x\.size\(1\) \(hidden\) must be a multiple of 128, got 192",
            lambda: dispatch(x=torch.zeros(M, 192, dtype=torch.bfloat16)))
    _expect(f, "too many tokens", ValueError,
            r"x has 9 tokens; expected at most num_max_dispatch_tokens_per_rank=8",
            lambda: dispatch(x=torch.zeros(9, H, dtype=torch.bfloat16),
                             topk_idx=torch.zeros(9, K, dtype=torch.int64)))
    # topk_idx
    _expect(f, "topk_idx int32", TypeError, r"topk_idx must be torch\.int64, got torch\.int32",
            lambda: dispatch(topk_idx=idx.int()))
    _expect(f, "topk_idx rows", ValueError, r"topk_idx must have shape \[num_tokens=8, top_k\], got \(7, 4\)",
            lambda: dispatch(topk_idx=idx[:7].contiguous()))
    _expect(f, "topk_idx strided", ValueError, r"topk_idx must be contiguous",
            lambda: dispatch(topk_idx=torch.zeros(M, 2 * K, dtype=torch.int64)[:, ::2]))
    high = idx.clone()
    high[2, 1] = E
    _expect(f, "expert id = num_experts", ValueError,
            rf"topk_idx\[2, 1\] = {E}; expected -1 or an expert id in \[0, num_experts={E}\)",
            lambda: dispatch(topk_idx=high))
    low = idx.clone()
    low[5, 3] = -2
    _expect(f, "expert id -2", ValueError, r"topk_idx\[5, 3\] = -2; expected -1",
            lambda: dispatch(topk_idx=low))
    dup = torch.zeros(M, K, dtype=torch.int64)  # every token names expert 0 four times
    _expect(f, "expert overflow", ValueError, r"routes 32 entries to expert 0; at most .*=8 fit",
            lambda: dispatch(topk_idx=dup))
    # num_experts, timeout, modes
    _expect(f, "num_experts % world", ValueError,
            rf"num_experts={E + 1} must be divisible by the group size {world}",
            lambda: dispatch(num_experts=E + 1))
    _expect(f, "timeout 0", ValueError, r"timeout_us must be -1 \(no timeout\) or a positive .*got 0",
            lambda: dispatch(timeout_us=0))
    _expect(f, "timeout float", TypeError, r"timeout_us must be an int", lambda: dispatch(timeout_us=1.5))
    _expect(f, "async+hook", ValueError, r"mutually exclusive",
            lambda: dispatch(async_finish=True, return_recv_hook=True))
    _expect(f, "use_fp8 int", TypeError, r"use_fp8 must be a bool, got 1", lambda: dispatch(use_fp8=1))
    # active_ranks
    _expect(f, "active_ranks int64", TypeError, r"active_ranks must be torch\.int32, got torch\.int64",
            lambda: dispatch(active_ranks=act.long()))
    _expect(f, "active_ranks length", ValueError,
            rf"active_ranks must have shape \[num_ranks={world}\], got \({world + 1},\)",
            lambda: dispatch(active_ranks=torch.ones(world + 1, dtype=torch.int32)))
    _expect(f, "active_ranks device", ValueError, r"active_ranks is on meta; expected x's device cpu",
            lambda: dispatch(active_ranks=torch.ones(world, dtype=torch.int32, device="meta")))
    # buffer size
    # The minimum is the hint without direct dispatch's slots.
    need = _ep_fast.size_hint(M, H, world, E, direct=False)
    assert need < Buffer.get_ep_buffer_size_hint(M, H, world, E) or not _ep_fast.direct_dispatch_requested()
    small = Buffer(group, need - 1)
    _expect(f, "buffer too small", ValueError,
            rf"num_ep_buffer_bytes={need - 1} is too small .*expected at least {need}",
            lambda: small.dispatch(x, idx, act, M, E, -1))
    _expect(f, "buffer 0", ValueError, r"num_ep_buffer_bytes=0 is too small",
            lambda: Buffer(group).dispatch(x, idx, act, M, E, -1))
    _expect(f, "hint hidden", ValueError, r"hidden must be a multiple of 128, got 100",
            lambda: Buffer.get_ep_buffer_size_hint(M, 100, world, E))
    _expect(f, "hint experts", ValueError, r"num_experts=3 must be divisible by the group size 2",
            lambda: Buffer.get_ep_buffer_size_hint(M, H, 2, 3))
    _expect(f, "sizes differ", ValueError, r"num_ep_buffer_bytes differs across ranks: \[",
            lambda: Buffer(group, need + rank))

    # handles and combine
    recv, _, handle, _, _ = dispatch()
    other_x, other_idx, _ = make_inputs(rank, M, H, E, K, seed=4)
    _, _, other_handle, _, _ = buf.dispatch(other_x, other_idx, act, M, E, -1, use_fp8=False)
    _expect(f, "other dispatch's handle", ValueError, r"is not the topk_idx of the dispatch",
            lambda: buf.combine(recv, idx, w, act, -1, other_handle))
    _expect(f, "handle type", TypeError, r"handle must be the 6-tuple returned by Buffer\.dispatch",
            lambda: buf.combine(recv, idx, w, act, -1, handle[:5]))
    _expect(f, "altered handle", ValueError, r"was altered",
            lambda: buf.combine(recv, idx, w, act, -1, (handle[0].clone(),) + handle[1:]))
    _expect(f, "other buffer's handle", ValueError, r"comes from another Buffer",
            lambda: small.combine(recv, idx, w, act, -1, handle))
    _expect(f, "combine x shape", ValueError, r"must have the dispatch layout shape",
            lambda: buf.combine(recv[:1], idx, w, act, -1, handle))
    _expect(f, "combine x dtype", TypeError, r"x \(expert outputs\) must be torch\.bfloat16",
            lambda: buf.combine(recv.float(), idx, w, act, -1, handle))
    _expect(f, "weights dtype", TypeError, r"topk_weights must be torch\.float32, got torch\.float64",
            lambda: buf.combine(recv, idx, w.double(), act, -1, handle))
    _expect(f, "weights shape", ValueError, r"topk_weights must have topk_idx's shape",
            lambda: buf.combine(recv, idx, w[:, :2].contiguous(), act, -1, handle))
    _expect(f, "out shape", ValueError, r"out must be a torch\.bfloat16 tensor of shape \(8, 256\)",
            lambda: buf.combine(recv, idx, w, act, -1, handle, out=torch.empty(8, 128)))
    _expect(f, "zero_copy", NotImplementedError, r"zero_copy=True needs the fast path",
            lambda: buf.combine(recv, idx, w, act, -1, handle, zero_copy=True))

    # The failed calls left the buffer usable: both handles still combine exactly.
    out, _, _ = buf.combine(recv, idx, w, act, -1, handle)
    check_combine(out, combine_reference(rank, x, idx, w, [1] * world, 2), False, "after errors")
    buf.update_ep_member()
    _expect(f, "stale handle", ValueError, r"predates update_ep_member\(\)",
            lambda: buf.combine(recv, other_idx, w, act, -1, other_handle))
    fresh_recv, _, fresh, _, _ = dispatch()
    _expect(f, "fresh handle, no fast path", NotImplementedError,
            r"get_next_combine_buffer needs the fast path", lambda: buf.get_next_combine_buffer(fresh))
    out, _, _ = buf.combine(fresh_recv, idx, w, act, -1, fresh)
    check_combine(out, combine_reference(rank, x, idx, w, [1] * world, 2), False, "after update")
    return f


def test_bad_inputs_raise_named_errors(backend):
    results = harness.run_ranks(_bad_input_worker, 2, backend, timeout_s=240)
    assert results == [[], []], "\n".join(sum(results, []))
