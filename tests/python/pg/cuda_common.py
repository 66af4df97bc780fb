"""What the `mooncake` CUDA test modules share: the backend, their timeouts,
the data paths they run under (MC_PG_CUDA_PATH), the GPU each rank runs on
and the world sizes (tests/python/gpu_ranks.py), and the backend's counters."""

import torch.distributed as dist

from gpu_ranks import use_rank_gpu, world_sizes  # noqa: F401  (re-exported for the CUDA suites)

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


def _device_calls():
    from mooncake import pg
    return int(pg._lib._device_collective_calls(dist.group.WORLD))


def _direct_calls():
    from mooncake import pg
    return int(pg._lib._direct_collective_calls(dist.group.WORLD))


def _agreements_skipped():
    from mooncake import pg
    return int(pg._lib._direct_agreements_skipped(dist.group.WORLD))
