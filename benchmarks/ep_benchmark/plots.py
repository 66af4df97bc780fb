"""--plot: latency CDFs (dispatch, combine, end-to-end) and the per-expert load histogram."""

import torch


def plot_results(path, dispatch_ms, combine_ms, e2e_ms, expert_counts, title):
    """Writes a PNG; the latencies are per-iteration critical-path (cross-rank max) samples."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, (ax_cdf, ax_load) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, samples in (("dispatch", dispatch_ms), ("combine", combine_ms),
                          ("end-to-end", e2e_ms)):
        s = torch.sort(torch.as_tensor(samples, dtype=torch.float64)).values
        frac = torch.arange(1, s.numel() + 1, dtype=torch.float64) / s.numel()
        ax_cdf.step(s.tolist(), frac.tolist(), where="post", label=name)
    ax_cdf.set_xlabel("latency per iteration, max over ranks (ms)")
    ax_cdf.set_ylabel("fraction of iterations")
    ax_cdf.set_title("latency CDF")
    ax_cdf.grid(True, alpha=0.3)
    ax_cdf.legend()

    counts = torch.as_tensor(expert_counts, dtype=torch.float64)
    ax_load.bar(range(counts.numel()), counts.tolist(), width=1.0)
    ax_load.axhline(float(counts.mean()), color="red", linestyle="--", label="mean")
    ax_load.set_xlabel("expert id")
    ax_load.set_ylabel("tokens routed (all ranks)")
    ax_load.set_title("expert load")
    ax_load.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
