"""What the `mooncake` CUDA test modules share: the backend, their timeouts,
the data paths they run under (MC_PG_CUDA_PATH), the GPU each rank runs on
and the backend's counters."""

import os

import torch
import torch.distributed as dist

BACKEND = "mooncake"
# A 2-rank run of _values takes about 12 s on the H200 (MPS on): a hang is
# reported, with every rank's last progress note and Python stack, after
# this long instead of eating the session's device time.
JOB_TIMEOUT_S = 150
OP_TIMEOUT_S = 60
# MC_PG_CUDA_PATH (and slot size) per parametrized path.
PATHS = {
    "staged": {"MC_PG_CUDA_PATH": "staged"},
    "kernels": {"MC_PG_CUDA_PATH": "kernels"},
    # wait() blocks until the kernels have finished and raises their failure.
    "kernels-blocking-wait": {"MC_PG_CUDA_PATH": "kernels", "MC_PG_CUDA_BLOCKING_WAIT": "1"},
    # 4 KiB slots, no direct path: a 24 MiB all_reduce runs thousands of chunks.
    "kernels-small-slots": {"MC_PG_CUDA_PATH": "kernels", "MC_PG_CUDA_SLOT_BYTES": "4096",
                            "MC_PG_CUDA_DIRECT": "0"},
}


def use_rank_gpu(rank):
    """Makes this rank's GPU current and returns it. Every rank shares GPU 0 (N
    processes on one GPU, under MPS), unless MC_TEST_GPUS=per-rank puts rank r on
    GPU r mod the GPU count: one process per GPU, peers over the links between
    GPUs (with more ranks than GPUs, some peers also share one)."""
    mode = os.environ.get("MC_TEST_GPUS", "shared")
    if mode not in ("shared", "per-rank"):
        raise ValueError(f"MC_TEST_GPUS={mode!r}: expected 'shared' or 'per-rank'")
    index = rank % torch.cuda.device_count() if mode == "per-rank" else 0
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _device_calls():
    from mooncake import pg
    return int(pg._lib._device_collective_calls(dist.group.WORLD))


def _direct_calls():
    from mooncake import pg
    return int(pg._lib._direct_collective_calls(dist.group.WORLD))


def _agreements_skipped():
    from mooncake import pg
    return int(pg._lib._direct_agreements_skipped(dist.group.WORLD))
