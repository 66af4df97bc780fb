"""Worker-side helpers for the EP suites: DeepEP-style constructed inputs and exact checks.

Every row a rank sends holds its rank (as rank - 128, exact in BF16 and, being
constant per 128-channel block, exact through FP8 too) except the last 128
columns, which carry the token's index. A received row therefore says where it
came from, and the expected receive set is computed from the all-gathered
top-k (through the gloo reference group), independently of the code under test.
"""

import pytest
import torch
import torch.distributed as dist

from mooncake.mooncake_ep_buffer import Buffer, fp8_dequantize

RANK_OFFSET = 128


def calc_diff(x, y):
    """1 - cosine-like similarity in double: 0 for identical tensors."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return float(1 - 2 * (x * y).sum() / denom)


def make_inputs(rank, num_tokens, hidden, num_experts, top_k, seed, masked=True):
    """(x, topk_idx, topk_weights) of one rank; distinct experts per token, some -1."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.full((num_tokens, hidden), float(rank - RANK_OFFSET), dtype=torch.bfloat16)
    x[:, -128:] = torch.arange(num_tokens, dtype=torch.float32).view(-1, 1).to(torch.bfloat16)
    scores = torch.randn(num_tokens, num_experts, generator=g)
    topk_idx = torch.topk(scores, top_k, dim=-1).indices
    if masked and num_tokens > 0:
        drop = torch.rand(num_tokens, top_k, generator=g) < 0.2
        topk_idx = torch.where(drop, torch.full_like(topk_idx, -1), topk_idx)
    topk_weights = torch.rand(num_tokens, top_k, generator=g) + 0.1
    return x.contiguous(), topk_idx.contiguous(), topk_weights


def gather_topk(topk_idx, max_tokens, ref_group):
    """Every rank's topk_idx, padded to max_tokens rows with -1: [R, max_tokens, top_k]."""
    world = dist.get_world_size(ref_group)
    padded = torch.full((max_tokens, topk_idx.size(1)), -1, dtype=torch.int64)
    padded[: topk_idx.size(0)] = topk_idx
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=ref_group)
    return torch.stack(out)


def check_dispatch(rank, world, recv, recv_count, handle, all_topk, active, num_experts,
                   max_tokens, hidden, use_fp8, label, views=None):
    """Asserts recv_x/recv_count/handle against the expected receive set.

    `active` is this rank's active_ranks; `views[r]` is rank r's (default: all
    the same). A source's rows arrive when it saw itself and this rank as
    active and this rank sees it as active.
    """
    views = views or [active] * world
    num_local = num_experts // world
    src_info, layout_range = handle[0], handle[1]
    data = fp8_dequantize(*recv) if use_fp8 else recv
    assert data.shape == (num_local, world * max_tokens, hidden), (label, data.shape)
    assert recv_count.dtype == torch.int32 and recv_count.shape == (num_local,), label
    if use_fp8:
        assert recv[0].dtype == torch.float8_e4m3fn and recv[1].dtype == torch.float32, label
        assert recv[1].shape == (num_local, world * max_tokens, hidden // 128), label
    for le in range(num_local):
        expert = rank * num_local + le
        expect = []
        for src in range(world):
            if not (active[src] and active[rank] and views[src][src] and views[src][rank]):
                continue
            tokens = torch.nonzero((all_topk[src] == expert).any(dim=1)).flatten().tolist()
            expect += [(src, t) for t in tokens]
        n = int(recv_count[le])
        assert n == len(expect), f"{label}: expert {expert} received {n}, expected {len(expect)}"
        rows = data[le, :n].float()
        srcs = (rows[:, 0] + RANK_OFFSET).long()
        toks = rows[:, -1].long()
        assert torch.equal(rows[:, :-128], (srcs.float() - RANK_OFFSET).view(-1, 1).expand(n, hidden - 128)), \
            f"{label}: expert {expert}: a row is not constant over its first channels"
        assert torch.equal(rows[:, -128:], toks.float().view(-1, 1).expand(n, 128)), \
            f"{label}: expert {expert}: token index columns differ"
        got = sorted(zip(srcs.tolist(), toks.tolist()))
        assert got == sorted(expect), f"{label}: expert {expert}: got {got}, expected {sorted(expect)}"
        assert torch.equal(src_info[le, :n].long(), toks), f"{label}: src_info of expert {expert}"
        for src in range(world):
            packed = int(layout_range[le, src])
            begin, count = packed >> 32, packed & 0xFFFFFFFF
            want = sum(1 for s, _ in expect if s == src)
            assert count == want, f"{label}: layout_range[{le}, {src}] count {count}, expected {want}"
            if count:
                assert bool((srcs[begin:begin + count] == src).all()), \
                    f"{label}: layout_range[{le}, {src}] = ({begin}, {count}) holds other sources"
    return data


def rows_by_source(recv, handle, le, use_fp8):
    """{(source rank, token): (row, scales or None)} of local expert `le`, on the CPU.

    Read through layout_range and src_info, so it does not depend on the
    order the sources' rows were packed in.
    """
    src_info, ranges = handle[0].cpu(), handle[1].cpu()
    data = (recv[0].view(torch.uint8) if use_fp8 else recv).cpu()
    scales = recv[1].cpu() if use_fp8 else None
    rows = {}
    for src in range(ranges.shape[1]):
        packed = int(ranges[le, src])
        begin, count = packed >> 32, packed & 0xFFFFFFFF
        for r in range(begin, begin + count):
            rows[(src, int(src_info[le, r]))] = (data[le, r], scales[le, r] if use_fp8 else None)
    return rows


def combine_reference(rank, x, topk_idx, topk_weights, active, num_local, sent=True):
    """x * sum of the weights of entries whose expert's rank is active, in double.

    sent=False: `active` changed after the dispatch (all rows went out), so only
    the experts' ranks matter, not whether this rank itself is active.
    """
    valid = topk_idx >= 0
    expert_rank = topk_idx.clamp(min=0) // num_local
    active_t = torch.tensor(active, dtype=torch.bool)
    valid &= active_t[expert_rank]
    if sent and not active[rank]:
        valid &= False
    weight = (topk_weights.double() * valid).sum(dim=1, keepdim=True)
    return x.double() * weight


def check_combine(combined, reference, use_fp8, label):
    assert combined.dtype == torch.bfloat16 and combined.shape == reference.shape, label
    if not bool(reference.any()):
        assert not bool(combined.any()), f"{label}: expected all zeros"
        return 0.0
    diff = calc_diff(combined, reference)
    limit = 9e-4 if use_fp8 else 1e-5
    assert diff < limit, f"{label}: calc_diff {diff:.3g} >= {limit}"
    return diff


def new_buffer(group, max_tokens, hidden, world, num_experts):
    return Buffer(group, Buffer.get_ep_buffer_size_hint(max_tokens, hidden, world, num_experts))


SYNC_MODES = ("sync", "async_finish", "return_recv_hook")


def local_topk(world, max_tokens, num_experts, top_k, seed, tokens_of):
    """gather_topk's result rebuilt from make_inputs (for runs where a rank has left)."""
    rows = []
    for src in range(world):
        _, idx, _ = make_inputs(src, tokens_of(src), 128, num_experts, top_k, seed)
        padded = torch.full((max_tokens, top_k), -1, dtype=torch.int64)
        padded[: idx.size(0)] = idx
        rows.append(padded)
    return torch.stack(rows)


def to_cpu(t):
    return tuple(v.cpu() for v in t) if isinstance(t, tuple) else t.cpu()


def run_round(ctx, buf, seed, use_fp8, mode, active, device, zero_copy=False, timeout_us=-1,
              gone=(), max_tokens=8, hidden=256, experts_per_rank=3, top_k=4):
    """One dispatch/combine round with every check; returns combine's calc_diff.

    `active` is uploaded before the dispatch. Ranks in `gone` have left: the
    dispatch must time out on them (timeout_us) and set their entries to 0.
    On ops that run on the fallback, zero_copy must raise NotImplementedError.
    """
    world, rank = ctx.world_size, ctx.rank
    num_experts = experts_per_rank * world
    tokens_of = lambda r: max_tokens - (r % 2)  # noqa: E731 - ranks send different counts
    label = (f"rank {rank} seed {seed} fp8={use_fp8} {mode} zero_copy={zero_copy} "
             f"active={active} gone={list(gone)}")
    x, topk_idx, topk_weights = make_inputs(rank, tokens_of(rank), hidden, num_experts, top_k,
                                            seed)
    if gone:
        all_topk = local_topk(world, max_tokens, num_experts, top_k, seed, tokens_of)
    else:
        all_topk = gather_topk(topk_idx, max_tokens, ctx.ref)
    x, topk_idx, topk_weights = x.to(device), topk_idx.to(device), topk_weights.to(device)
    active_ranks = torch.tensor(active, dtype=torch.int32, device=device)
    after = [0 if r in gone else a for r, a in enumerate(active)]
    async_finish, hook_mode = mode == "async_finish", mode == "return_recv_hook"

    recv, recv_count, handle, event, hook = buf.dispatch(
        x, topk_idx, active_ranks, max_tokens, num_experts, timeout_us=timeout_us,
        use_fp8=use_fp8, async_finish=async_finish, return_recv_hook=hook_mode)
    assert (hook is not None) == hook_mode, label
    if hook_mode:
        hook()
    else:
        event.current_stream_wait()
    if async_finish:
        assert any(t is x for t in event.extra_tensors), f"{label}: event does not hold x"
    assert active_ranks.tolist() == after, f"{label}: active_ranks {active_ranks.tolist()}"
    expert_out = check_dispatch(rank, world, to_cpu(recv), recv_count.cpu(), to_cpu(handle[:2]),
                                all_topk, after, num_experts, max_tokens, hidden, use_fp8,
                                label).to(device)

    fast_op = buf.use_fast_path and torch.device(device).type == "cuda"
    combine_in = expert_out
    if not fast_op:
        with pytest.raises(NotImplementedError, match="zero_copy=True needs the fast path"):
            buf.combine(expert_out, topk_idx, topk_weights, active_ranks, -1, handle,
                        zero_copy=True)
        with pytest.raises(NotImplementedError, match="get_next_combine_buffer needs the fast path"):
            buf.get_next_combine_buffer(handle)
        zero_copy = False
    elif zero_copy:
        combine_in = buf.get_next_combine_buffer(handle)
        assert combine_in.shape == expert_out.shape, label
        combine_in.copy_(expert_out)

    combined, event, hook = buf.combine(
        combine_in, topk_idx, topk_weights, active_ranks, timeout_us, handle,
        zero_copy=zero_copy, async_finish=async_finish, return_recv_hook=hook_mode)
    if hook_mode:
        hook()
        hook()  # idempotent
    else:
        event.current_stream_wait()
    assert active_ranks.tolist() == after, f"{label}: active_ranks after combine"
    ref = combine_reference(rank, x.cpu(), topk_idx.cpu(), topk_weights.cpu(), after,
                            experts_per_rank)
    return check_combine(combined.cpu(), ref, use_fp8, label)
