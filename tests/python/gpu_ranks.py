"""Where the ranks of a multi-process CUDA test run, and at which world sizes.

Every rank shares GPU 0 (N processes on one GPU, under MPS) unless
MC_TEST_GPUS=per-rank puts rank r on GPU r mod the GPU count: one process
per GPU, peers reached over the links between GPUs (with more ranks than
GPUs, some peers also share one). MC_TEST_WORLD_SIZE=N adds world size N
to the sizes a test parametrizes over (the 8-GPU runs: `world_sizes(2, 4)`
becomes [2, 4, 8]); unset, a test runs at its own sizes only.
"""

import os

GPUS_ENV = "MC_TEST_GPUS"
WORLD_SIZE_ENV = "MC_TEST_WORLD_SIZE"


def gpu_mode():
    mode = os.environ.get(GPUS_ENV, "shared")
    if mode not in ("shared", "per-rank"):
        raise ValueError(f"{GPUS_ENV}={mode!r}: expected 'shared' or 'per-rank'")
    return mode


def rank_gpu_index(rank, device_count):
    """The GPU index of `rank` under gpu_mode()."""
    return rank % device_count if gpu_mode() == "per-rank" else 0


def use_rank_gpu(rank):
    """Makes this rank's GPU current and returns it."""
    import torch

    index = rank_gpu_index(rank, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def world_sizes(*sizes):
    """`sizes`, plus MC_TEST_WORLD_SIZE when it is set (sorted, once each)."""
    raw = os.environ.get(WORLD_SIZE_ENV, "")
    if not raw:
        return list(sizes)
    try:
        extra = int(raw)
    except ValueError:
        raise ValueError(f"{WORLD_SIZE_ENV}={raw!r}: expected a number of ranks") from None
    if extra < 2:
        raise ValueError(f"{WORLD_SIZE_ENV}={extra}: expected at least 2 ranks")
    return sorted(set(sizes) | {extra})
