"""EP dispatch/combine over the group's collectives (the fallback path).

Produces the same layout and handle as the CUDA fast path (docs/ep-guide.md):
a rank's rows for local expert `le` are packed at slots
[0, recv_count[le]) of recv_x[le], ordered by source rank, then source token.

One dispatch is three collective steps and no per-token Python:
  1. one host copy of [tokens per expert | bad ids | active_ranks] (this is
     also where out-of-range expert ids are found, so checking them costs no
     extra synchronisation),
  2. a small all_to_all of the per-expert counts,
  3. one all_to_all_single of the rows, each row carrying its payload (BF16,
     or FP8 + scales) and its source token index, split by destination rank.
Combine sends the expert outputs back along the same splits (no count
exchange) and reduces them weighted in FP32 on the token's owner.
"""

import datetime

import torch
import torch.distributed as dist

from mooncake._ep_checks import FP8_BLOCK

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_AMAX_FLOOR = 1e-4  # keeps an all-zero block's scale finite


class EPRankFailure(RuntimeError):
    """A collective of the fallback failed and the backend named the ranks.

    Those ranks are already set to 0 in the active_ranks tensor passed to the
    op; the op's outputs are not valid. `failed_ranks` lists them.
    """

    def __init__(self, message, failed_ranks):
        super().__init__(message)
        self.failed_ranks = failed_ranks


def fp8_quantize(x):
    """[T, H] BF16 -> (float8_e4m3fn [T, H], float32 scales [T, H/128]); scale = amax/448."""
    t, h = x.shape
    blocks = x.view(t, h // FP8_BLOCK, FP8_BLOCK).float()
    amax = blocks.abs().amax(dim=-1).clamp(min=FP8_AMAX_FLOOR)
    # amax / 448 and x * (448 / amax) with IEEE divisions, as the CUDA kernels
    # compute them (mooncake-ep/core/fp8_rule.h), so both paths produce the same
    # bytes. Tensor / tensor on purpose: torch's CUDA division by a Python
    # scalar multiplies by its reciprocal, which can differ in the last bit.
    full = torch.full_like(amax, FP8_MAX)
    scales = amax / full
    data = (blocks * (full / amax).unsqueeze(-1)).to(torch.float8_e4m3fn).view(t, h)
    return data, scales


def fp8_dequantize(data, scales):
    """Inverse of fp8_quantize for any leading shape: (data [..., H], scales [..., H/128]) -> BF16."""
    h = data.size(-1)
    blocks = data.float().view(*data.shape[:-1], h // FP8_BLOCK, FP8_BLOCK)
    return (blocks * scales.unsqueeze(-1)).view(data.shape).to(torch.bfloat16)


def comm_device(group, data_device):
    """The device the group's collectives take tensors on."""
    name = str(dist.get_backend(group)).lower()
    if name in ("gloo", "mooncake-cpu"):
        return torch.device("cpu")
    if name in ("nccl", "mooncake"):
        return torch.device("cuda", torch.cuda.current_device())
    return data_device


def _failed_ranks(work, num_ranks):
    hint_fn = getattr(work, "failed_ranks_hint", None)
    if hint_fn is None:
        return []
    try:
        hint = hint_fn()
    except Exception:  # noqa: BLE001 - no evidence is the same as an empty hint
        return []
    hint = torch.as_tensor(hint).flatten()[:num_ranks]
    return [int(r) for r in torch.nonzero(hint).flatten()]


class Collectives:
    """The group, where its collectives run, and how a failed one is reported."""

    def __init__(self, group, rank, num_ranks):
        self.group = group
        self.rank = rank
        self.num_ranks = num_ranks
        self.backend = str(dist.get_backend(group))

    def wait(self, work, what, timeout_us, active_ranks):
        try:
            if timeout_us == -1:
                work.wait()
            else:
                work.wait(datetime.timedelta(microseconds=timeout_us))
        except Exception as e:  # noqa: BLE001 - re-raised with the EP context
            failed = [r for r in _failed_ranks(work, self.num_ranks) if r != self.rank]
            if failed:
                active_ranks[failed] = 0
                raise EPRankFailure(
                    f"Mooncake EP fallback: {what} on the {self.backend} group failed and the "
                    f"backend named ranks {failed}; they are now 0 in active_ranks and this "
                    f"op's outputs are invalid (retry after recovery): {e}",
                    failed,
                ) from e
            limit = "no timeout_us" if timeout_us == -1 else f"timeout_us={timeout_us}"
            raise RuntimeError(
                f"Mooncake EP fallback: {what} on the {self.backend} group did not complete "
                f"({limit}); the backend did not say which rank failed, so active_ranks is "
                f"unchanged: {e}"
            ) from e

    def all_to_all(self, out, inp, out_splits, in_splits, what, timeout_us, active_ranks,
                   defer=False):
        work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group,
                                      async_op=True)
        if defer:
            return lambda: self.wait(work, what, timeout_us, active_ranks)
        self.wait(work, what, timeout_us, active_ranks)
        return None


class DispatchRoute:
    """Everything combine needs from its dispatch (kept inside the handle)."""

    __slots__ = ("sent_entries", "send_splits", "recv_splits", "recv_slots", "num_tokens",
                 "top_k", "topk_idx")


def _row_layout(hidden, use_fp8):
    """(payload bytes, scale bytes) of one row; + 4 bytes of source token index."""
    if use_fp8:
        return hidden, hidden // FP8_BLOCK * 4
    return hidden * 2, 0


def _host_counts(topk_idx, active_ranks, rank, num_experts, num_local):
    """Host copy of per-expert counts of sent entries, bad-id count and the active mask."""
    flat = topk_idx.view(-1)
    bad = (flat < -1) | (flat >= num_experts)
    active = active_ranks != 0
    dst_rank = flat.clamp(0, num_experts - 1) // num_local
    sendable = (flat >= 0) & ~bad & active[dst_rank] & active[rank]
    # Keys: expert id for sent entries, num_experts for skipped, num_experts+1 for bad.
    key = torch.where(sendable, flat, torch.full_like(flat, num_experts))
    key = torch.where(bad, torch.full_like(flat, num_experts + 1), key)
    counts = torch.bincount(key, minlength=num_experts + 2)
    host = torch.cat([counts, active_ranks.to(torch.int64)]).cpu()
    return key, host[: num_experts + 2], host[num_experts + 2:]


def _raise_bad_ids(topk_idx, num_experts):
    flat = topk_idx.view(-1)
    pos = int(torch.nonzero((flat < -1) | (flat >= num_experts))[0])
    t, k = divmod(pos, topk_idx.size(1))
    raise ValueError(
        f"topk_idx[{t}, {k}] = {int(flat[pos])}; expected -1 or an expert id in "
        f"[0, num_experts={num_experts})"
    )


def dispatch(coll, x, topk_idx, active_ranks, max_tokens, num_experts, use_fp8, timeout_us,
             defer):
    """Returns (recv_x or (data, scales), recv_count, src_info, layout_range, route, finish).

    `finish` is None when the receive is done, else a callable completing it
    (return_recv_hook).
    """
    num_ranks, rank = coll.num_ranks, coll.rank
    num_local = num_experts // num_ranks
    num_tokens, hidden = x.shape
    top_k = topk_idx.size(1)
    dev = x.device
    comm_dev = comm_device(coll.group, dev)

    key, counts, active_host = _host_counts(topk_idx, active_ranks, rank, num_experts, num_local)
    if int(counts[num_experts + 1]) > 0:
        _raise_bad_ids(topk_idx, num_experts)
    per_expert = counts[:num_experts]
    over = torch.nonzero(per_expert > max_tokens).flatten()
    if over.numel() > 0:
        e = int(over[0])
        raise ValueError(
            f"topk_idx routes {int(per_expert[e])} entries to expert {e}; at most "
            f"num_max_dispatch_tokens_per_rank={max_tokens} fit (is an expert named twice for a token?)"
        )

    # Sent entries grouped by destination rank, then local expert, then token.
    num_sent = int(per_expert.sum())
    order = torch.sort(key, stable=True).indices[:num_sent]
    sent_tokens = order // top_k

    payload_bytes, scale_bytes = _row_layout(hidden, use_fp8)
    row_bytes = payload_bytes + scale_bytes + 4
    rows = torch.empty(num_tokens, row_bytes, dtype=torch.uint8, device=dev)
    if use_fp8:
        data, scales = fp8_quantize(x)
        rows[:, :payload_bytes] = data.view(torch.uint8)
        rows[:, payload_bytes:payload_bytes + scale_bytes] = scales.view(torch.uint8)
    else:
        rows[:, :payload_bytes] = x.view(torch.uint8)
    rows[:, -4:] = torch.arange(num_tokens, dtype=torch.int32, device=dev).view(-1, 1).view(torch.uint8)
    send_rows = rows.index_select(0, sent_tokens).view(torch.int32).to(comm_dev)

    # The small exchange: how many rows each source sends to each local expert.
    recv_counts = torch.empty(num_experts, dtype=torch.int64, device=comm_dev)
    coll.all_to_all(recv_counts, per_expert.to(comm_dev), None, None, "the count all_to_all",
                    timeout_us, active_ranks)
    recv_counts = recv_counts.cpu().view(num_ranks, num_local)
    send_splits = per_expert.view(num_ranks, num_local).sum(1).tolist()
    recv_splits = recv_counts.sum(1).tolist()

    # Slots: rows from inactive sources are received (the sender sent them) but dropped.
    kept = recv_counts * (active_host != 0).to(torch.int64).view(-1, 1)
    offsets = torch.cumsum(kept, 0) - kept  # [src, le], exclusive over sources
    recv_count = kept.sum(0).to(torch.int32)
    layout_range = ((offsets << 32) | kept).t().contiguous()
    flat_counts = recv_counts.flatten()
    group_of_row = torch.repeat_interleave(torch.arange(num_ranks * num_local), flat_counts)
    starts = torch.cumsum(flat_counts, 0) - flat_counts
    j = torch.arange(group_of_row.numel()) - starts[group_of_row]
    src, le = group_of_row // num_local, group_of_row % num_local
    slots_per_expert = num_ranks * max_tokens
    recv_slots = le * slots_per_expert + offsets.flatten()[group_of_row] + j
    recv_slots = torch.where(active_host[src] != 0, recv_slots, torch.full_like(recv_slots, -1))

    data_dtype = torch.float8_e4m3fn if use_fp8 else torch.bfloat16
    recv_x = torch.empty(num_local, slots_per_expert, hidden, dtype=data_dtype, device=dev)
    recv_scales = None
    if use_fp8:
        recv_scales = torch.empty(num_local, slots_per_expert, hidden // FP8_BLOCK,
                                  dtype=torch.float32, device=dev)
    src_info = torch.full((num_local, slots_per_expert), -1, dtype=torch.int32, device=dev)
    recv_slots = recv_slots.to(dev)

    recv_rows = torch.empty(sum(recv_splits), row_bytes // 4, dtype=torch.int32, device=comm_dev)
    complete = coll.all_to_all(recv_rows, send_rows, recv_splits, send_splits,
                               "the dispatch all_to_all", timeout_us, active_ranks, defer=defer)

    def unpack():
        got = recv_rows.to(dev).view(torch.uint8)
        keep = recv_slots >= 0
        slots = recv_slots[keep]
        got = got[keep]
        recv_x.view(-1, hidden).view(torch.uint8 if use_fp8 else torch.int16)[slots] = (
            got[:, :payload_bytes].view(torch.uint8 if use_fp8 else torch.int16))
        if use_fp8:
            recv_scales.view(-1, hidden // FP8_BLOCK)[slots] = (
                got[:, payload_bytes:payload_bytes + scale_bytes].contiguous().view(torch.float32))
        src_info.view(-1)[slots] = got[:, -4:].contiguous().view(torch.int32).view(-1)

    route = DispatchRoute()
    route.sent_entries = order
    route.send_splits = send_splits
    route.recv_splits = recv_splits
    route.recv_slots = recv_slots
    route.num_tokens = num_tokens
    route.top_k = top_k
    route.topk_idx = topk_idx
    packed = (recv_x, recv_scales) if use_fp8 else recv_x
    layout_range = layout_range.to(dev)
    recv_count = recv_count.to(dev)

    if complete is None:
        unpack()
        return packed, recv_count, src_info, layout_range, route, None

    def finish():
        complete()
        unpack()

    return packed, recv_count, src_info, layout_range, route, finish


def combine(coll, x, topk_idx, topk_weights, active_ranks, route, num_experts, timeout_us, out,
            defer):
    """Returns (out, finish); finish is None when done, else completes the receive."""
    num_local = num_experts // coll.num_ranks
    hidden = x.size(-1)
    dev = x.device
    comm_dev = comm_device(coll.group, dev)

    slots = route.recv_slots
    send = x.view(-1, hidden).index_select(0, slots.clamp(min=0))
    send = torch.where((slots >= 0).view(-1, 1), send, torch.zeros((), dtype=send.dtype, device=dev))
    send = send.view(torch.int32).to(comm_dev)
    recv = torch.empty(sum(route.send_splits), hidden // 2, dtype=torch.int32, device=comm_dev)
    complete = coll.all_to_all(recv, send, route.send_splits, route.recv_splits,
                               "the combine all_to_all", timeout_us, active_ranks, defer=defer)

    entries = route.sent_entries
    tokens = entries // route.top_k
    experts = topk_idx.view(-1).index_select(0, entries)
    weights = topk_weights.view(-1).index_select(0, entries)
    # Experts whose rank is inactive now contribute nothing (set since dispatch too).
    weights = weights * (active_ranks.index_select(0, experts // num_local) != 0)

    def reduce():
        rows = recv.to(dev).view(torch.bfloat16)
        acc = torch.zeros(route.num_tokens, hidden, dtype=torch.float32, device=dev)
        acc.index_add_(0, tokens, rows.float() * weights.view(-1, 1))
        out.copy_(acc)

    if complete is None:
        reduce()
        return out, None

    def finish():
        complete()
        reduce()

    return out, finish
