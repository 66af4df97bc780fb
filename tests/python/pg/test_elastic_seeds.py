"""The elastic examples of seed 000 and seed 004, as written, end to end in
real processes (mooncake-cpu, CPU tensors): two founders with a reserved
slot, a third process that joins it (is_extension=True, join_group) while a
founder polls get_peer_state and calls recover_ranks, then all three active
(size 3; seed 004's active_ranks tensor follows the committed membership)
and an exact all_reduce over them. Procs 0-2 run seed 000's example, procs
3-5 seed 004's, each trio on its own store.

Processes coordinate through the harness's file events, as in
test_elastic_scenarios.py; the job runs once and its tests share it.
"""

import time

import pytest
import torch
import torch.distributed as dist

import harness
from elastic_checks import (ELASTIC_ENV, STEP_S, Checks, check_all_reduce, expect_checks, last_out,
                            leave, run_guarded, run_job_once, wait_all, wait_mask)

pytestmark = pytest.mark.elastic

JOB_TIMEOUT_S = 200


def _job_seeds(ctx, port_004):
    """Procs 0-2: seed 000's example; procs 3-5: seed 004's (active_ranks tensors,
    max_world_size), each on its own store. Backend mooncake-cpu, CPU tensors."""
    checks = Checks(ctx)
    seed = "000" if ctx.rank < 3 else "004"
    rank = ctx.rank % 3
    port = ctx.port if seed == "000" else port_004
    from mooncake import pg as mpg

    def body():
        with checks.step(f"seed{seed}: the example as written"):
            if rank < 2:
                if seed == "000":
                    dist.init_process_group(
                        backend=ctx.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        pg_options=mpg.MooncakeBackendOptions(
                            3,      # max_group_size
                            False,  # is_extension
                        ),
                    )
                else:
                    active_ranks = torch.tensor([1, 1, 0], dtype=torch.int32)
                    dist.init_process_group(
                        backend=ctx.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        pg_options=mpg.MooncakeBackendOptions(
                            active_ranks,
                            False,  # is_extension
                            3,      # max_world_size
                        ),
                    )
                ctx.signal(f"seed{seed}_up_{rank}")
                if rank == 0:
                    wait_all(ctx, f"seed{seed}_up", [0, 1])
                    ctx.signal(f"seed{seed}_launch_joiner")
                backend = dist.group.WORLD
                join_ranks = [2]
                deadline = time.monotonic() + STEP_S
                while not all(mpg.get_peer_state(backend, join_ranks)):
                    # Continue serving, back off, or poll according to your scheduler policy.
                    if time.monotonic() > deadline:
                        raise TimeoutError("get_peer_state never reported the joiner ready")
                    time.sleep(0.01)
                mpg.recover_ranks(backend, join_ranks)
            else:
                if seed == "000":
                    dist.init_process_group(
                        backend=ctx.backend, init_method=f"tcp://127.0.0.1:{port}", rank=2, world_size=3,
                        pg_options=mpg.MooncakeBackendOptions(
                            3,     # max_group_size
                            True,  # is_extension
                        ),
                    )
                else:
                    active_ranks = torch.tensor([1, 1, 1], dtype=torch.int32)
                    dist.init_process_group(
                        backend=ctx.backend, init_method=f"tcp://127.0.0.1:{port}", rank=2, world_size=3,
                        pg_options=mpg.MooncakeBackendOptions(
                            active_ranks,
                            True,  # is_extension
                            3,     # max_world_size
                        ),
                    )
                backend = dist.group.WORLD
                # Collectives are local-only before join_group (warm-up window).
                mpg.join_group(backend)
        with checks.step(f"seed{seed}: all three active afterwards, size 3"):
            wait_mask(ctx, [1, 1, 1])
            assert dist.get_world_size() == 3, f"dist.get_world_size() {dist.get_world_size()}"
            if seed == "004":
                assert active_ranks.tolist() == [1, 1, 1], (
                    f"the active_ranks tensor given to MooncakeBackendOptions holds {active_ranks.tolist()}, "
                    f"expected the committed membership [1, 1, 1]")
        with checks.step(f"seed{seed}: all_reduce over the 3 ranks"):
            check_all_reduce({0, 1, 2}, 1, rank)
        ctx.signal(f"seed{seed}_done_{rank}")
        wait_all(ctx, f"seed{seed}_done", [0, 1, 2])

    def final():
        if rank != 0:
            leave(ctx, checks)
        else:
            last_out(ctx, [ctx.rank + 1, ctx.rank + 2])

    return run_guarded(checks, body, final)


_job = {}


def _run(backend):
    return run_job_once(_job, backend, backend, _job_seeds, 6, args=(harness.free_port(),),
                        late={2: "seed000_launch_joiner", 5: "seed004_launch_joiner"},
                        timeout_s=JOB_TIMEOUT_S, env=ELASTIC_ENV, init=False, ref_group=False)


@pytest.mark.parametrize("seed", ["000", "004"])
def test_seed_examples_as_written(backend, seed):
    expect_checks(_run(backend), f"seed{seed}")


def test_seed_processes_leave_cleanly(backend):
    """Every process leaves with destroy_process_group (no error)."""
    job = _run(backend)
    if job["error"] is not None:
        pytest.fail(f"the seeds job failed as a whole, so its exits were never checked:\n"
                    f"{job['error']}", pytrace=False)
    expect_checks(job, "leave:")
