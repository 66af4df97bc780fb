"""P2P across a membership change, in real processes (mooncake-cpu).

Ranks 0..2 are founders of a group with max_group_size 4; slot 3 joins later
(is_extension=True + join_group, activate_ranks from rank 0). Before the join:

* rank 0 posts a "gate" irecv from rank 1 that takes rank 0's whole receive pool
  for rank 1 (MC_PG_P2P_POOL_BYTES), then an irecv on tag 5; rank 1 posts the
  matching isend on tag 5. The pair is matched but cannot move: no pool chunk is
  free until rank 1 sends on the gate's tag.
* rank 1 posts an isend on tag 6 (staged, so its Work completes) whose irecv
  rank 0 posts only after the join.

Then every rank runs an all_reduce over the 4 ranks, which switches each data
plane to the new view while those operations are pending. The pair (0, 1) was
active all along, so they must survive: after the gate send, all three
transfers complete with the exact values. Finally P2P with the new rank 3
works in both directions.

Processes coordinate through the harness's file events, never sleeps.
"""


import pytest
import torch
import torch.distributed as dist

from elastic_checks import (STEP_S, Checks, check_all_reduce, check_p2p_pair, expect_checks, init,
                            join_group, last_out, leave, mask, mask_of, options, pg, run_guarded,
                            run_job_once, wait_event, wait_mask, wait_peers_ready)

pytestmark = pytest.mark.elastic

MAX = 4
# Four 1 MiB chunks per peer: the gate takes rank 0's whole receive pool for
# rank 1; rank 1's two small messages take one send chunk each, which leaves
# room to stage the gate's message.
POOL_BYTES = 4 << 20
# Long enough for the pending P2P operations to outlive the join (their
# deadline is the op timeout); no failure is expected in this job.
ENV = {"MC_PG_TIMEOUT_MS": "60000", "MC_PG_P2P_POOL_BYTES": str(POOL_BYTES)}
JOB_TIMEOUT_S = 200
GATE_TAG, MATCHED_TAG, STAGED_TAG = 9, 5, 6


def _data(tag, n):
    return torch.arange(n, dtype=torch.int64) * 13 + tag * 1000003


def _expect_equal(got, want, what):
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (
        f"{what}: {bad.numel()} of {want.numel()} values wrong, first at {int(bad[0])}: "
        f"{int(got[int(bad[0])])} != {int(want[int(bad[0])])}")


def _job(ctx):
    checks = Checks(ctx)
    P = pg()
    slot = ctx.rank
    gate_n, small_n = POOL_BYTES // 8, 4099  # 4099 int64 fit one chunk

    def body():
        if slot == 3:
            if ctx.signalled("abort"):
                return
            with checks.step("join: init slot 3 with is_extension=True"):
                init(ctx, 3, MAX, options(MAX, True))
            with checks.step("join: join_group returns once active"):
                ctx.signal("joiner_joining")
                join_group(dist.group.WORLD, timeout_s=STEP_S)
                assert mask() == mask_of({0, 1, 2, 3}, MAX), f"get_active_ranks {mask()}"
            with checks.step("join: P2P with rank 2 before any collective in the new view"):
                check_p2p_pair(slot, 2, 3, tag=40)
        else:
            with checks.step("setup: bootstrap of 3 founders"):
                init(ctx, slot, 3, options(MAX))
                assert mask() == mask_of({0, 1, 2}, MAX), f"get_active_ranks {mask()}"
            pending = {}
            if slot == 0:
                with checks.step("before: rank 0 posts the gate and the matched irecv"):
                    gate_out = torch.zeros(gate_n, dtype=torch.int64)
                    pending["gate"] = (gate_out, dist.irecv(gate_out, 1, tag=GATE_TAG))
                    out = torch.zeros(small_n, dtype=torch.int64)
                    pending["matched"] = (out, dist.irecv(out, 1, tag=MATCHED_TAG))
                    ctx.signal("recvs_posted")
            if slot == 1:
                with checks.step("before: rank 1 posts the matched isend and a staged isend"):
                    wait_event(ctx, "recvs_posted")
                    matched = dist.isend(_data(MATCHED_TAG, small_n), 0, tag=MATCHED_TAG)
                    staged = dist.isend(_data(STAGED_TAG, small_n), 0, tag=STAGED_TAG)
                    # Staged sends complete before any receive takes them.
                    matched.wait()
                    staged.wait()
                    ctx.signal("sends_staged")
            if slot == 0:
                with checks.step("before: the matched pair is held by the gate"):
                    wait_event(ctx, "sends_staged")
                    assert not pending["matched"][1].is_completed(), (
                        "the tag-5 irecv completed before the join: the gate did not hold it")
                    ctx.signal("launch_joiner")
                with checks.step("join: activate_ranks([3]) from rank 0"):
                    wait_event(ctx, "joiner_joining")
                    wait_peers_ready(ctx, [3])
                    P.activate_ranks(dist.group.WORLD, [3])
                    assert mask() == mask_of({0, 1, 2, 3}, MAX), f"get_active_ranks {mask()}"
            else:
                with checks.step("join: founders see slot 3 active"):
                    wait_mask(ctx, mask_of({0, 1, 2, 3}, MAX), timeout_s=STEP_S)
            if slot == 2:
                # No collective has applied the view on rank 2 yet: the post
                # itself must switch its data plane to it.
                with checks.step("join: P2P with rank 2 before any collective in the new view"):
                    check_p2p_pair(slot, 2, 3, tag=40)
        with checks.step("join: all_reduce over the 4 ranks applies the view"):
            assert dist.get_world_size() == 4, f"dist.get_world_size() {dist.get_world_size()}"
            check_all_reduce({0, 1, 2, 3}, 11, slot)
        if slot == 0:
            with checks.step("survive: pending irecvs of rank 0 outlive the view change"):
                for name in ("gate", "matched"):
                    work = pending[name][1]
                    assert not work.is_completed(), (
                        f"the {name} irecv ended at the view change (aborted?) instead of "
                        f"waiting for its data")
                ctx.signal("view_applied_0")
                pending["gate"][1].wait()
                _expect_equal(pending["gate"][0], _data(GATE_TAG, gate_n), "gate irecv")
                pending["matched"][1].wait()
                _expect_equal(pending["matched"][0], _data(MATCHED_TAG, small_n),
                              "irecv posted before the join")
            with checks.step("survive: data staged before the join reaches an irecv after it"):
                out = torch.zeros(small_n, dtype=torch.int64)
                dist.irecv(out, 1, tag=STAGED_TAG).wait()
                _expect_equal(out, _data(STAGED_TAG, small_n), "isend staged before the join")
        if slot == 1:
            with checks.step("survive: rank 1 opens the gate after the view change"):
                wait_event(ctx, "view_applied_0")
                dist.isend(_data(GATE_TAG, gate_n), 0, tag=GATE_TAG).wait()
        with checks.step("joiner: P2P with rank 3 in both directions"):
            check_p2p_pair(slot, 0, 3, tag=100)
            check_p2p_pair(slot, 3, 1, tag=200)
            check_p2p_pair(slot, 2, 3, tag=300)

    def final():
        if slot == 0:
            # Process 0 hosts the store and the Coordinator: it goes last.
            if not ctx.signalled("launch_joiner"):
                ctx.signal("launch_joiner")
            last_out(ctx, [1, 2, 3])
        else:
            leave(ctx, checks)

    return run_guarded(checks, body, final)


_result = {}


def _run(backend):
    return run_job_once(_result, backend, backend, _job, 4, timeout_s=JOB_TIMEOUT_S, env=ENV,
                        init=False, ref_group=False, late={3: "launch_joiner"})


def test_pending_p2p_between_staying_ranks_survives_a_join(backend):
    job = _run(backend)
    expect_checks(job, "before:")
    expect_checks(job, "join:")
    expect_checks(job, "survive:")


def test_p2p_with_the_joined_rank(backend):
    expect_checks(_run(backend), "joiner:")


def test_every_process_leaves_cleanly(backend):
    expect_checks(_run(backend), "leave:")
