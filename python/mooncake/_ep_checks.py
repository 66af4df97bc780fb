"""Argument checks for Buffer.dispatch/combine.

Every message names the argument, the value it had and what was expected.
Type/dtype/layout problems raise TypeError, value problems ValueError. The
checks read shapes and dtypes only; the one check that looks at data (expert
ids in range) is done by the fallback from the counts it computes anyway, so
it costs no extra device synchronisation.
"""

import torch

FP8_BLOCK = 128  # channels per FP8 scale
HIDDEN_ALIGN = 128  # hidden % 128 == 0 (which implies the runtime's % 16)


def check_int(name, value, minimum=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def check_timeout(timeout_us):
    if isinstance(timeout_us, bool) or not isinstance(timeout_us, int):
        raise TypeError(
            f"timeout_us must be an int (microseconds, or -1 for no timeout), got {timeout_us!r}"
        )
    if timeout_us != -1 and timeout_us <= 0:
        raise ValueError(
            f"timeout_us must be -1 (no timeout) or a positive number of microseconds, "
            f"got {timeout_us}"
        )
    return timeout_us


def check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_hidden(hidden, what="x.size(1) (hidden)"):
    if hidden % HIDDEN_ALIGN != 0:
        raise ValueError(f"{what} must be a multiple of {HIDDEN_ALIGN}, got {hidden}")


def check_x(x, num_max_dispatch_tokens_per_rank):
    check_tensor("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [num_tokens, hidden], got shape {tuple(x.shape)}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be torch.bfloat16, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()} for shape {tuple(x.shape)}")
    check_hidden(x.size(1))
    if x.size(0) > num_max_dispatch_tokens_per_rank:
        raise ValueError(
            f"x has {x.size(0)} tokens; expected at most num_max_dispatch_tokens_per_rank="
            f"{num_max_dispatch_tokens_per_rank}"
        )


def check_topk_idx(topk_idx, num_tokens, device):
    check_tensor("topk_idx", topk_idx)
    if topk_idx.dtype != torch.int64:
        raise TypeError(f"topk_idx must be torch.int64, got {topk_idx.dtype}")
    if topk_idx.dim() != 2 or topk_idx.size(0) != num_tokens:
        raise ValueError(
            f"topk_idx must have shape [num_tokens={num_tokens}, top_k], got {tuple(topk_idx.shape)}"
        )
    if not topk_idx.is_contiguous():
        raise ValueError(f"topk_idx must be contiguous, got strides {topk_idx.stride()}")
    if topk_idx.device != device:
        raise ValueError(f"topk_idx is on {topk_idx.device}; expected x's device {device}")


def check_topk_weights(topk_weights, topk_idx):
    check_tensor("topk_weights", topk_weights)
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights must be torch.float32, got {topk_weights.dtype}")
    if topk_weights.shape != topk_idx.shape:
        raise ValueError(
            f"topk_weights must have topk_idx's shape {tuple(topk_idx.shape)}, "
            f"got {tuple(topk_weights.shape)}"
        )
    if topk_weights.device != topk_idx.device:
        raise ValueError(
            f"topk_weights is on {topk_weights.device}; expected topk_idx's device {topk_idx.device}"
        )


def check_active_ranks(active_ranks, num_ranks, device):
    check_tensor("active_ranks", active_ranks)
    if active_ranks.dtype != torch.int32:
        raise TypeError(f"active_ranks must be torch.int32, got {active_ranks.dtype}")
    if active_ranks.dim() != 1 or active_ranks.numel() != num_ranks:
        raise ValueError(
            f"active_ranks must have shape [num_ranks={num_ranks}], got {tuple(active_ranks.shape)}"
        )
    if active_ranks.device != device:
        raise ValueError(f"active_ranks is on {active_ranks.device}; expected x's device {device}")
    if not active_ranks.is_contiguous():
        raise ValueError("active_ranks must be contiguous (the runtime updates it in place)")


def check_num_experts(num_experts, num_ranks):
    check_int("num_experts", num_experts, 1)
    if num_experts % num_ranks != 0:
        raise ValueError(
            f"num_experts={num_experts} must be divisible by the group size {num_ranks} "
            f"(num_experts % group_size == 0)"
        )


def check_expert_output(x, num_local_experts, num_slots, hidden):
    check_tensor("x", x)
    want = (num_local_experts, num_slots, hidden)
    if tuple(x.shape) != want:
        raise ValueError(
            f"x (expert outputs) must have the dispatch layout shape {want} "
            f"[num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, hidden], "
            f"got {tuple(x.shape)}"
        )
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x (expert outputs) must be torch.bfloat16, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x (expert outputs) must be contiguous, got strides {x.stride()}")


def check_out(out, num_tokens, hidden, device):
    check_tensor("out", out)
    if tuple(out.shape) != (num_tokens, hidden) or out.dtype != torch.bfloat16:
        raise ValueError(
            f"out must be a torch.bfloat16 tensor of shape ({num_tokens}, {hidden}), "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    if out.device != device:
        raise ValueError(f"out is on {out.device}; expected {device}")
