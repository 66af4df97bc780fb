"""Routing generators for ep_benchmark: uniform, k_hot incast and zipf.

Each returns (topk_idx int64 [num_tokens, top_k], topk_weights float32
[num_tokens, top_k]) with distinct experts per token and softmax weights.
A torch.Generator seeded by the caller (seed + rank) makes every rank's
routing independent but reproducible.
"""

import torch


def _weights(num_tokens, top_k, gen, device):
    logits = torch.randn(num_tokens, top_k, generator=gen)
    return torch.softmax(logits, dim=-1).to(device)


def _check_common(num_tokens, num_experts, top_k):
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")


def uniform_routing(num_tokens, num_experts, top_k, gen, device="cpu", **_):
    """Top-k of standard normal scores: every expert equally likely."""
    _check_common(num_tokens, num_experts, top_k)
    scores = torch.randn(num_tokens, num_experts, generator=gen)
    idx = torch.topk(scores, top_k, dim=-1).indices
    return idx.to(device), _weights(num_tokens, top_k, gen, device)


def check_k_hot(num_experts, top_k, hot_experts, hot_fraction):
    if hot_experts > num_experts:
        raise ValueError(
            f"hot_experts={hot_experts} must be <= num_experts={num_experts}")
    if hot_experts < top_k:
        raise ValueError(
            f"hot_experts={hot_experts} must be >= top_k={top_k}: a hot token needs top_k "
            f"distinct experts among the hot ones")
    if not 0.0 < hot_fraction < 1.0:
        raise ValueError(f"hot_fraction must be in the open interval (0, 1), got {hot_fraction}")


def k_hot_routing(num_tokens, num_experts, top_k, gen, device="cpu", hot_experts=32,
                  hot_fraction=0.9, **_):
    """Incast: hot_fraction of the tokens take all top-k among experts [0, hot_experts)."""
    _check_common(num_tokens, num_experts, top_k)
    check_k_hot(num_experts, top_k, hot_experts, hot_fraction)
    num_hot = int(round(num_tokens * hot_fraction))
    hot = torch.topk(torch.randn(num_hot, hot_experts, generator=gen), top_k, dim=-1).indices
    cold = torch.topk(torch.randn(num_tokens - num_hot, num_experts, generator=gen), top_k,
                      dim=-1).indices
    idx = torch.cat([hot, cold])
    # Shuffled so the hot tokens do not sit in one block of the batch.
    idx = idx[torch.randperm(num_tokens, generator=gen)]
    return idx.contiguous().to(device), _weights(num_tokens, top_k, gen, device)


def check_zipf(zipf_alpha):
    if not zipf_alpha > 0:
        raise ValueError(f"zipf_alpha must be > 0, got {zipf_alpha}")


def zipfian_routing(num_tokens, num_experts, top_k, gen, device="cpu", zipf_alpha=1.0, **_):
    """P(expert i) proportional to 1/(i+1)^alpha; top-k without replacement by Gumbel-max."""
    _check_common(num_tokens, num_experts, top_k)
    check_zipf(zipf_alpha)
    ranks = torch.arange(1, num_experts + 1, dtype=torch.float64)
    log_p = -zipf_alpha * torch.log(ranks)
    log_p = log_p - torch.logsumexp(log_p, 0)
    u = torch.rand(num_tokens, num_experts, generator=gen, dtype=torch.float64).clamp(min=1e-20)
    gumbel = -torch.log(-torch.log(u))
    idx = torch.topk(log_p + gumbel, top_k, dim=-1).indices
    return idx.to(device), _weights(num_tokens, top_k, gen, device)


ROUTING_MODES = {
    "uniform": uniform_routing,
    "k_hot": k_hot_routing,
    "zipf": zipfian_routing,
}


def generate_routing(mode, num_tokens, num_experts, top_k, seed, device="cpu", **kwargs):
    """(topk_idx, topk_weights) for `mode`, from a generator seeded with `seed`."""
    if mode not in ROUTING_MODES:
        raise ValueError(f"routing mode {mode!r} is unknown; expected one of {sorted(ROUTING_MODES)}")
    gen = torch.Generator().manual_seed(seed)
    return ROUTING_MODES[mode](num_tokens, num_experts, top_k, gen, device=device, **kwargs)
