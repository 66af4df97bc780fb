"""Metrics of ep_benchmark: latency percentiles, expert load, throughput, the JSON document."""

import torch
import torch.distributed as dist

from mooncake._ep_checks import HIDDEN_ALIGN

PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999))
STAT_KEYS = tuple(k for k, _ in PERCENTILES) + ("mean",)


def latency_stats(samples_ms):
    """{p50, p90, p99, p999, mean} of a 1-D sequence (linear interpolation between samples)."""
    t = torch.as_tensor(samples_ms, dtype=torch.float64).flatten()
    if t.numel() == 0:
        raise ValueError("latency_stats needs at least one sample")
    q = torch.tensor([p for _, p in PERCENTILES], dtype=torch.float64)
    values = torch.quantile(t, q).tolist()
    out = {k: float(v) for (k, _), v in zip(PERCENTILES, values)}
    out["mean"] = float(t.mean())
    return out


def critical_path(per_rank_ms):
    """Per-iteration max over ranks: [world, iters] -> [iters] (a step ends with its slowest rank)."""
    return torch.as_tensor(per_rank_ms, dtype=torch.float64).max(dim=0).values


def gather_latencies(local_ms, group=None):
    """All ranks' [iters] latency tensors as one [world, iters] float64 CPU tensor."""
    local = torch.as_tensor(local_ms, dtype=torch.float64)
    device = _collective_device(group)
    parts = [torch.empty_like(local, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.to(device), group=group)
    return torch.stack([p.cpu() for p in parts])


def _collective_device(group):
    name = str(dist.get_backend(group)).lower()
    if name in ("nccl", "mooncake"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def local_expert_counts(topk_idx, num_experts):
    """Tokens per expert from this rank's routing (-1 entries ignored), float64 CPU."""
    flat = topk_idx.flatten().cpu()
    return torch.bincount(flat[flat >= 0], minlength=num_experts).to(torch.float64)


def expert_load_summary(global_counts):
    counts = torch.as_tensor(global_counts, dtype=torch.float64)
    mean = float(counts.mean())
    return {
        "max_tokens_per_expert": float(counts.max()),
        "min_tokens_per_expert": float(counts.min()),
        "mean_tokens_per_expert": mean,
        "imbalance_ratio": float(counts.max()) / mean if mean > 0 else 0.0,
    }


def compute_global_expert_load(topk_idx, num_experts, group=None):
    """(summary dict, global counts) after an all_reduce(SUM) of every rank's bincount."""
    counts = local_expert_counts(topk_idx, num_experts)
    device = _collective_device(group)
    counts_dev = counts.to(device)
    dist.all_reduce(counts_dev, group=group)
    counts = counts_dev.cpu()
    return expert_load_summary(counts), counts


def tokens_per_second(num_tokens, world_size, mean_e2e_ms):
    """num_tokens * world_size / (mean_e2e_ms / 1000)."""
    if mean_e2e_ms <= 0:
        raise ValueError(f"mean_e2e_ms must be > 0, got {mean_e2e_ms}")
    return num_tokens * world_size / (mean_e2e_ms / 1000.0)


def assemble_json_output(args, world_size, dispatch_ms, combine_ms, e2e_ms, expert_load,
                         extra=None):
    """The result document; dispatch/combine/e2e_ms are [world, iters] per-rank latencies."""
    dispatch_ms, combine_ms, e2e_ms = (torch.as_tensor(t, dtype=torch.float64)
                                       for t in (dispatch_ms, combine_ms, e2e_ms))
    e2e_stats = latency_stats(critical_path(e2e_ms))

    def per_rank(t):
        return {f"rank{r}": latency_stats(t[r]) for r in range(t.size(0))}

    doc = {
        "benchmark": "mooncake_ep",
        "world_size": world_size,
        "num_experts": args.num_experts,
        "hidden_size": args.hidden_size,
        "routing_mode": args.routing_mode,
        "metrics": {
            "dispatch_latency_ms": latency_stats(critical_path(dispatch_ms)),
            "combine_latency_ms": latency_stats(critical_path(combine_ms)),
            "end_to_end_latency_ms": e2e_stats,
            "tokens_per_second": tokens_per_second(args.num_tokens, world_size, e2e_stats["mean"]),
            "expert_load": expert_load,
            "per_rank_stats": {
                "dispatch_latency_ms": per_rank(dispatch_ms),
                "combine_latency_ms": per_rank(combine_ms),
                "e2e_latency_ms": per_rank(e2e_ms),
            },
        },
        "backend": args.backend,
        "top_k": args.top_k,
        "num_tokens": args.num_tokens,
        "dtype": args.dtype,
        "zero_copy": args.zero_copy,
        "async_finish": args.async_finish,
        "return_recv_hook": args.return_recv_hook,
        "warmup_iters": args.warmup_iters,
        "iters": args.iters,
        "pg_backend": args.pg_backend,
    }
    if args.routing_mode == "k_hot":
        doc["hot_experts"] = args.hot_experts
        doc["hot_fraction"] = args.hot_fraction
    if args.routing_mode == "zipf":
        doc["zipf_alpha"] = args.zipf_alpha
    doc.update(extra or {})
    return doc


def schema_errors(doc, world_size):
    """Where `doc` departs from the documented schema ([] when it conforms)."""
    errors = []

    def need(obj, key, kind, where):
        if key not in obj:
            errors.append(f"{where}.{key} missing")
            return None
        if not isinstance(obj[key], kind) or isinstance(obj[key], bool) and kind is not bool:
            errors.append(f"{where}.{key} is {type(obj[key]).__name__}, expected {kind}")
            return None
        return obj[key]

    def stats(obj, where):
        for k in STAT_KEYS:
            need(obj, k, (int, float), where)

    for key, kind in (("benchmark", str), ("world_size", int), ("num_experts", int),
                      ("hidden_size", int), ("routing_mode", str), ("backend", str),
                      ("top_k", int), ("num_tokens", int), ("dtype", str), ("zero_copy", bool),
                      ("async_finish", bool), ("return_recv_hook", bool), ("warmup_iters", int),
                      ("iters", int), ("pg_backend", str)):
        need(doc, key, kind, "$")
    m = need(doc, "metrics", dict, "$") or {}
    for key in ("dispatch_latency_ms", "combine_latency_ms", "end_to_end_latency_ms"):
        stats(need(m, key, dict, "metrics") or {}, f"metrics.{key}")
    need(m, "tokens_per_second", (int, float), "metrics")
    load = need(m, "expert_load", dict, "metrics") or {}
    for key in ("max_tokens_per_expert", "min_tokens_per_expert", "mean_tokens_per_expert",
                "imbalance_ratio"):
        need(load, key, (int, float), "metrics.expert_load")
    prs = need(m, "per_rank_stats", dict, "metrics") or {}
    for key in ("dispatch_latency_ms", "combine_latency_ms", "e2e_latency_ms"):
        ranks = need(prs, key, dict, "metrics.per_rank_stats") or {}
        if sorted(ranks) != sorted(f"rank{r}" for r in range(world_size)):
            errors.append(f"metrics.per_rank_stats.{key} has keys {sorted(ranks)}")
        for r, s in ranks.items():
            stats(s, f"metrics.per_rank_stats.{key}.{r}")
    mode = doc.get("routing_mode")
    for key, present in (("hot_experts", mode == "k_hot"), ("hot_fraction", mode == "k_hot"),
                         ("zipf_alpha", mode == "zipf")):
        if (key in doc) != present:
            errors.append(f"$.{key} {'missing' if present else 'present'} in mode {mode}")
    return errors


def payload_bytes(num_copies, hidden, use_fp8):
    """(dispatch, combine) payload bytes of `num_copies` token copies, each counted once.

    A dispatched copy is its data (FP8: hidden bytes plus one float scale per
    128 channels; BF16: 2 * hidden); a combined copy is a BF16 row. Headers
    and signals are not payload.
    """
    per_dispatch = hidden + hidden // HIDDEN_ALIGN * 4 if use_fp8 else 2 * hidden
    return num_copies * per_dispatch, num_copies * 2 * hidden


def bandwidth_summary(dispatch_bytes, combine_bytes, dispatch_ms, combine_ms, copy_bytes_per_s,
                      num_ranks):
    """Payload bytes/s at the median critical-path latency, and their fraction of the copy rate.

    dispatch_bytes, combine_bytes: one step's payload over all `num_ranks`
    ranks. The `_per_rank` figures divide the rates by `num_ranks`: a rank's
    own copies over the step's time, the figure DeepEP's low-latency tests and
    NCCL EP's ep_bench publish (docs/ep-guide.md, "Published anchors").
    copy_bytes_per_s: the bytes a device-to-device copy copies per second, as
    measured in the same run. A payload byte moved between ranks on one GPU
    is such a copy (read once, written once), so the fraction compares like
    with like; the HBM traffic of either is twice its bytes.
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks={num_ranks}: expected at least 1")
    d = dispatch_bytes / (float(dispatch_ms) / 1000.0)
    c = combine_bytes / (float(combine_ms) / 1000.0)
    out = {
        "dispatch_payload_bytes": int(dispatch_bytes),
        "combine_payload_bytes": int(combine_bytes),
        "dispatch_payload_bytes_per_s": d,
        "combine_payload_bytes_per_s": c,
        "dispatch_payload_bytes_per_s_per_rank": d / num_ranks,
        "combine_payload_bytes_per_s_per_rank": c / num_ranks,
        "device_copy_bytes_per_s": copy_bytes_per_s,
        "device_copy_traffic_bytes_per_s": 2 * copy_bytes_per_s if copy_bytes_per_s else None,
    }
    if copy_bytes_per_s:
        out["dispatch_fraction_of_copy_rate"] = d / copy_bytes_per_s
        out["combine_fraction_of_copy_rate"] = c / copy_bytes_per_s
    return out
