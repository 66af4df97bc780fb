"""Failures in calls other than all_reduce, in each failure mode, and the death
of the Coordinator's process (issue 9, item 10; docs/pg-elastic.md).

* Per mode, 5 founders; in turn a rank is SIGKILLed while the others are
  inside an all_gather (rank 4), an all_to_all (rank 3) and a broadcast
  (rank 2): the survivors' Work fails with the whole failed-Work contract
  naming exactly the victim (elastic_checks.check_failed_work); after the
  mode's step the victim is inactive and an all_reduce among the survivors is
  exact. Then rank 1 is SIGKILLed while rank 0 waits in an irecv from it: the
  recv fails naming rank 1 with the hint marking it; a P2P failure is not
  membership evidence, so the view stays as it was in every mode.
* The Coordinator's process (rank 0, also the store's host here) is
  SIGKILLed: a subgroup of the survivors keeps working, a call on the whole
  group fails naming rank 0, and the membership can no longer change
  (deactivate_ranks fails with a Coordinator error, the view stays).

The victims die while the others are provably inside the call (they posted
it and said so); the victim itself never enters it. Dying in the middle of a
transfer is test_elastic_scenarios.py's all_reduce case.
"""


import pytest
import torch
import torch.distributed as dist

from elastic_checks import (ELASTIC_ENV, TIMEOUT_MS, Checks, check_all_reduce, check_failed_work,
                            expect_checks, init, mask, mask_of, options, pg, run_guarded, run_job_once,
                            wait_all,
                            wait_event, wait_facts, wait_mask)

pytestmark = pytest.mark.elastic

MAX = 5
N = 4096


def _post(op, slot, active):
    """Posts `op` over the current group (size 5 in every step: rank 0 stays)."""
    ws = dist.get_world_size()
    if op == "all_gather":
        outs = [torch.zeros(N, dtype=torch.int64) for _ in range(ws)]
        return dist.all_gather(outs, torch.full((N,), slot, dtype=torch.int64), async_op=True)
    if op == "all_to_all":
        outs = [torch.zeros(N, dtype=torch.int64) for _ in range(ws)]
        ins = [torch.full((N,), slot * 10 + p, dtype=torch.int64) for p in range(ws)]
        return dist.all_to_all(outs, ins, async_op=True)
    assert op == "broadcast"
    return dist.broadcast(torch.full((N,), slot, dtype=torch.int64), src=0, async_op=True)


def _mode_step(ctx, checks, mode, slot, victim, survivors, name):
    want = mask_of(set(survivors), MAX)
    with checks.step(f"{name}: the mode's step makes rank {victim} inactive"):
        if mode == "default":
            assert mask() == want, f"get_active_ranks {mask()} when the failed op completed, expected {want}"
        elif mode == "deferred":
            pg().sync_after_failure(dist.group.WORLD)
        else:
            event = name.replace("/", "_") + "_observed"
            ctx.signal(f"{event}_{slot}")
            if slot == survivors[0]:
                wait_all(ctx, event, survivors)
                pg().deactivate_ranks(dist.group.WORLD, [victim])
        wait_mask(ctx, want)


def _job_ops(ctx, mode):
    checks = Checks(ctx)
    slot = ctx.rank

    def body():
        with checks.step(f"{mode}/bootstrap"):
            init(ctx, slot, MAX, options(MAX, False, mode))
            check_all_reduce(set(range(MAX)), 1, slot)
        active = set(range(MAX))
        for salt, (op, victim) in enumerate((("all_gather", 4), ("all_to_all", 3), ("broadcast", 2)), 2):
            name = f"{mode}/{op}"
            survivors = sorted(active - {victim})
            if slot == victim:
                wait_all(ctx, f"{op}_entered", survivors)
                ctx.kill_self()
            with checks.step(f"{name}: survivors' Work fails naming rank {victim}", fatal=False):
                work = _post(op, slot, active)
                ctx.signal(f"{op}_entered_{slot}")
                res = wait_facts(work)
                check_failed_work(res, MAX, {victim}, rf"\[failed ranks: {victim}\]")
            _mode_step(ctx, checks, mode, slot, victim, survivors, name)
            with checks.step(f"{name}: next all_reduce among the survivors is exact"):
                check_all_reduce(set(survivors), salt, slot)
            active = set(survivors)
        name = f"{mode}/p2p"
        if slot == 1:
            wait_event(ctx, "irecv_posted")
            ctx.kill_self()
        with checks.step(f"{name}: a pending irecv from a killed rank fails naming it"):
            work = dist.irecv(torch.zeros(N, dtype=torch.int64), src=1)
            ctx.signal("irecv_posted")
            res = wait_facts(work)
            check_failed_work(res, MAX, {1}, r"recv from rank 1 .* failed: PEER_FAILURE: rank 1 failed")
        with checks.step(f"{name}: a P2P failure leaves the view as it was"):
            assert mask() == mask_of({0, 1}, MAX), f"get_active_ranks {mask()}, expected [1, 1, 0, 0, 0]"

    return run_guarded(checks, body, lambda: None)


def _job_coordinator(ctx):
    checks = Checks(ctx)
    slot = ctx.rank

    def body():
        with checks.step("coordinator/bootstrap"):
            init(ctx, slot, 3, options(3, False, "framework"))
            sub = dist.new_group([1, 2])
            check_all_reduce({0, 1, 2}, 1, slot)
        if slot == 0:
            wait_all(ctx, "ready", [1, 2])
            ctx.kill_self()
        ctx.signal(f"ready_{slot}")
        with checks.step("coordinator: a subgroup of the survivors keeps working"):
            check_all_reduce({1, 2}, 2, slot, group=sub)
        with checks.step("coordinator: a call on the whole group fails naming rank 0", fatal=False):
            res = wait_facts(dist.all_reduce(torch.ones(N), async_op=True))
            check_failed_work(res, 3, {0}, r"\[failed ranks: 0\]")
        with checks.step("coordinator: the subgroup still works afterwards"):
            check_all_reduce({1, 2}, 3, slot, group=sub)
        with checks.step("coordinator: membership can no longer change"):
            if slot == 1:
                err = None
                try:
                    pg().deactivate_ranks(dist.group.WORLD, [0], timeout=TIMEOUT_MS / 1000.0)
                except dist.DistBackendError as e:
                    err = str(e)
                assert err is not None, "deactivate_ranks([0]) succeeded with the Coordinator dead"
                assert "Coordinator" in err, f"deactivate_ranks error does not name the Coordinator: {err}"
            assert mask() == [1, 1, 1], f"get_active_ranks {mask()}, expected [1, 1, 1]"

    return run_guarded(checks, body, lambda: None)


_jobs = {}


def _run(name, backend):
    kw = dict(timeout_s=180, env=ELASTIC_ENV, init=False, ref_group=False)
    if name == "coordinator":
        return run_job_once(_jobs, (name, backend), backend, _job_coordinator, 3,
                            expect_killed=[0], **kw)
    return run_job_once(_jobs, (name, backend), backend, _job_ops, MAX, args=(name,),
                        expect_killed=[1, 2, 3, 4], **kw)


@pytest.mark.parametrize("op", ["all_gather", "all_to_all", "broadcast", "p2p"])
@pytest.mark.parametrize("mode", ["default", "deferred", "framework"])
def test_sigkill_during_op(backend, mode, op):
    expect_checks(_run(mode, backend), f"{mode}/{op}")


def test_coordinator_death(backend):
    expect_checks(_run("coordinator", backend), "coordinator")

