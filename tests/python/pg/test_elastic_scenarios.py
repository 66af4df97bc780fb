"""Elastic membership of mooncake-cpu, end to end, in real processes.

Written against the documented API (seed 000, docs/design/control-plane.md):

* the three failure-handling modes x {a rank SIGKILLed in the middle of an
  all_reduce, a rank that stalls (sleeps instead of calling the collective)}:
  the survivors' op completes within the collective timeout (+ the
  reconciliation window in the default mode) with local_success False and
  failed_ranks_hint marking the bad rank; after the mode's step (automatic
  sync / sync_after_failure / deactivate_ranks) get_active_ranks shows it
  inactive and the next all_reduce among the survivors is exact;
* a replacement process takes the dead rank's slot (is_extension=True,
  join_group; a survivor polls get_peer_state and calls recover_ranks), then
  all_reduce and P2P in both directions include it;
* subgroups created after the join, in the same order on every process;
* scale-up into a reserved never-used slot (max_group_size 8, 4 founders,
  a 5th joins: world size 4 -> 5), with redundant activate_ranks calls;
* holes: active [1, 0, 1, 0] -> dist.get_world_size() == 3 and collectives
  skip the hole; in-place rejoin of deactivated ranks;
* join_group with nobody activating fails with an error naming activation.

The elastic examples of seeds 000 and 004, as written, are in
test_elastic_seeds.py.

Processes never coordinate through a process group a failure could break: they
use the harness's file events. Each job is one run_ranks call (module-scoped,
shared by its tests); every check is named, and a test asserts its checks on
every process. A failed step on one process sets an "abort" event so the others
stop instead of waiting out the watchdog.

MC_PG_TIMEOUT_MS=3000 and MC_PG_RECONCILE_WINDOW_MS=4000 keep it fast.
"""

import time

import pytest
import torch
import torch.distributed as dist

from elastic_checks import (ELASTIC_ENV, SLACK_S, STEP_S, TIMEOUT_MS, WINDOW_MS, Checks, big_input,
                            check_all_reduce, check_died_inside, check_failed_op,
                            die_inside_all_reduce, check_p2p_pair, expect_checks, init,
                            join_group, last_out, leave, mask, mask_of, options, outcome, pg,
                            run_guarded, run_job_once, wait_all, wait_event, wait_mask, wait_peers_ready)

pytestmark = pytest.mark.elastic

JOB_TIMEOUT_S = 200
JOIN_TIMEOUT_S = 8  # join_group(timeout=...) where the build takes one (its default is long)
T_S, W_S = TIMEOUT_MS / 1000.0, WINDOW_MS / 1000.0


def fail_bound(mode):
    """How long a survivor's failed op may take: the collective timeout, plus the
    reconciliation window when the op syncs before completing (default mode)."""
    return T_S + (W_S if mode == "default" else 0.0) + SLACK_S


# =============================================================================== failure phases

def _phase_kill(ctx, checks, mode, slot, victim, active, max_group_size, salt):
    """`victim` is SIGKILLed in the middle of an all_reduce that the others already
    entered; returns the new active set. Runs on every member of `active`."""
    survivors = sorted(active - {victim})
    if slot == victim:
        wait_all(ctx, f"kill{salt}_entered", survivors)
        die_inside_all_reduce(ctx, slot, active, f"kill{salt}_at")
    with checks.step(f"{mode}/kill: survivors' op fails in time with local_success/hint", fatal=False):
        t0 = time.monotonic()
        mine = big_input(slot)
        work = dist.all_reduce(mine, async_op=True)
        ctx.signal(f"kill{salt}_entered_{slot}")
        res = outcome(work, t0)
        check_died_inside(ctx, victim, f"kill{salt}_at")
        if res["error"] is None:
            # The victim's worker threads run on between its look at its own
            # output and the SIGKILL, so under load its last piece can still
            # reach everyone: then the op is exact, and the next one, which
            # the victim never enters, is the one that must fail.
            total = sum(r + 1 for r in active)
            assert torch.equal(mine, torch.full_like(mine, total)), (
                f"the op the victim died in returned normally with a wrong sum "
                f"(expected {total} everywhere, got values {mine.unique().tolist()[:8]})")
            checks.numbers[f"{mode}/kill_completed_before_death"] = 1
            t0 = time.monotonic()
            res = outcome(dist.all_reduce(big_input(slot), async_op=True), t0)
        checks.numbers[f"{mode}/kill_fail_s"] = round(res["elapsed_s"], 3)
        check_failed_op(res, victim, max_group_size, slot, fail_bound(mode))
    _after_failure(ctx, checks, mode, "kill", slot, victim, active, survivors, max_group_size, salt)
    return set(survivors)


def _phase_stall(ctx, checks, mode, slot, staller, active, max_group_size, salt):
    """`staller` sleeps instead of calling the all_reduce; returns the new active set."""
    survivors = sorted(active - {staller})
    if slot == staller:
        with checks.step(f"{mode}/stall: the stalled rank sleeps until the survivors are done"):
            wait_event(ctx, f"stall{salt}_done", timeout_s=STEP_S + 60)
        with checks.step(f"{mode}/stall: the stalled rank's mirror shows it inactive", fatal=False):
            # Survivors that already finished may have left the group too
            # (destroy_process_group leaves), so only this slot is checked.
            wait_mask(ctx, f"slot {staller} inactive", timeout_s=15,
                      match=lambda m: m[staller] == 0)
        return set(survivors)
    with checks.step(f"{mode}/stall: survivors' op fails in time with local_success/hint", fatal=False):
        t0 = time.monotonic()
        work = dist.all_reduce(big_input(slot), async_op=True)
        res = outcome(work, t0)
        checks.numbers[f"{mode}/stall_fail_s"] = round(res["elapsed_s"], 3)
        check_failed_op(res, staller, max_group_size, slot, fail_bound(mode))
    _after_failure(ctx, checks, mode, "stall", slot, staller, active, survivors, max_group_size, salt)
    ctx.signal(f"stall{salt}_fin_{slot}")
    if slot == survivors[0]:
        wait_all(ctx, f"stall{salt}_fin", survivors)
        ctx.signal(f"stall{salt}_done")
    return set(survivors)


def _after_failure(ctx, checks, mode, fault, slot, bad, active, survivors, max_group_size, salt):
    P = pg()
    want = mask_of(set(survivors), max_group_size)
    old_size = max(active) + 1
    new_size = max(survivors) + 1
    if mode == "default":
        with checks.step(f"{mode}/{fault}: rank {bad} inactive when the failed op completes", fatal=False):
            got = mask()
            assert got == want, f"get_active_ranks {got}, expected {want} (auto-sync applies the view first)"
    elif mode == "deferred":
        with checks.step(f"{mode}/{fault}: sync_after_failure applies the new view"):
            t0 = time.monotonic()
            P.sync_after_failure(dist.group.WORLD)
            checks.numbers[f"{mode}/{fault}_sync_s"] = round(time.monotonic() - t0, 3)
            got = mask()
            assert got == want, f"get_active_ranks {got} after sync_after_failure, expected {want}"
    else:  # framework-managed: PG only reports; the framework deactivates
        with checks.step(f"{mode}/{fault}: PG leaves membership unchanged by itself", fatal=False):
            got = mask()
            old = mask_of(active, max_group_size)
            assert got == old, f"get_active_ranks {got} before deactivate_ranks, expected {old}"
        ctx.signal(f"{fault}{salt}_observed_{slot}")
        with checks.step(f"{mode}/{fault}: deactivate_ranks([{bad}]) applies the new view"):
            if slot == survivors[0]:
                wait_all(ctx, f"{fault}{salt}_observed", survivors)
                P.deactivate_ranks(dist.group.WORLD, [bad])
                got = mask()
                assert got == want, f"get_active_ranks {got} after deactivate_ranks returned, expected {want}"
            else:
                wait_mask(ctx, want)
    if mode != "framework":
        with checks.step(f"{mode}/{fault}: every survivor converges on the new view"):
            wait_mask(ctx, want)
    with checks.step(f"{mode}/{fault}: size is highest active rank + 1", fatal=False):
        assert dist.get_world_size() == new_size, (
            f"dist.get_world_size() {dist.get_world_size()}, expected {new_size} (was {old_size})")
    with checks.step(f"{mode}/{fault}: next all_reduce among survivors is exact"):
        check_all_reduce(set(survivors), salt, slot)


# =============================================================================== jobs

def _job_modes(ctx, mode):
    """4 founders (max_group_size 4): rank 3 is killed, then rank 2 stalls."""
    checks = Checks(ctx)
    slot, MAX = ctx.rank, 4

    def body():
        with checks.step(f"{mode}/bootstrap"):
            init(ctx, slot, 4, options(MAX, False, mode))
            assert mask() == [1, 1, 1, 1], f"get_active_ranks {mask()} after bootstrap"
            assert dist.get_world_size() == 4
            check_all_reduce({0, 1, 2, 3}, 1, slot)
        active = _phase_kill(ctx, checks, mode, slot, 3, {0, 1, 2, 3}, MAX, salt=2)
        _phase_stall(ctx, checks, mode, slot, 2, active, MAX, salt=3)

    def final():
        if slot != 0:
            leave(ctx, checks)
        else:
            last_out(ctx, [1, 2])

    return run_guarded(checks, body, final)


# proc -> slot for the replacement job: 0..3 founders, 4 replaces slot 3, 5 joins slot 4.
REPLACE_SLOTS = {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 4}


def _job_replace(ctx):
    """Default mode, max_group_size 8, 4 founders. Kill 3 -> replacement in slot 3
    -> P2P, subgroups -> scale-up into slot 4 (two activators) -> stall of 2."""
    checks = Checks(ctx)
    P = pg()
    proc, MAX = ctx.rank, 8
    slot = REPLACE_SLOTS[proc]

    def body():
        if proc == 5:  # launched late, only for the scale-up
            _scale_up(ctx, checks, proc, slot, MAX)
            return
        active = {0, 1, 2, 3}
        if proc <= 3:
            with checks.step("default/bootstrap"):
                init(ctx, slot, 4, options(MAX))
                assert mask() == mask_of(active, MAX), f"get_active_ranks {mask()} after bootstrap"
                assert dist.get_world_size() == 4
                check_all_reduce(active, 1, slot)
            with checks.step("diag: get_num_synced_ranks counts the 4 founders", fatal=False):
                n = pg().get_num_synced_ranks(dist.group.WORLD)
                assert n == 4, f"get_num_synced_ranks {n}, expected 4"
            active = _phase_kill(ctx, checks, "default", slot, 3, active, MAX, salt=2)
            if slot == 0:
                ctx.signal("launch_replacement")

        # ---- replacement of slot 3
        if proc == 4:
            if ctx.signalled("abort"):
                return
            with checks.step("replace: init with is_extension=True"):
                init(ctx, 3, MAX, options(MAX, True))
            with checks.step("replace: collectives are local-only before join_group", fatal=False):
                t = torch.full((9,), 77, dtype=torch.int64)
                dist.all_reduce(t)
                assert t.eq(77).all(), f"all_reduce before join_group gave {t.tolist()}, expected its own input"
            with checks.step("replace: join_group returns once active"):
                t0 = time.monotonic()
                ctx.signal("replacement_joining")
                join_group(dist.group.WORLD, timeout_s=STEP_S)
                checks.numbers["join_group_s"] = round(time.monotonic() - t0, 3)
                got = mask()
                assert got == mask_of({0, 1, 2, 3}, MAX), f"get_active_ranks {got} after join_group"
        elif slot == 0:
            with checks.step("replace: get_peer_state then recover_ranks([3])"):
                wait_event(ctx, "replacement_joining")
                wait_peers_ready(ctx, [3])
                P.recover_ranks(dist.group.WORLD, [3])
                got = mask()
                assert got == mask_of({0, 1, 2, 3}, MAX), f"get_active_ranks {got} after recover_ranks returned"
        elif proc in (1, 2):
            with checks.step("replace: survivors see slot 3 active again"):
                wait_mask(ctx, mask_of({0, 1, 2, 3}, MAX))
        active = {0, 1, 2, 3}
        with checks.step("replace: size back to 4", fatal=False):
            assert dist.get_world_size() == 4, f"dist.get_world_size() {dist.get_world_size()}"
        with checks.step("replace: all_reduce includes the replacement"):
            check_all_reduce(active, 4, slot)
        with checks.step("replace: P2P with the replacement, both directions"):
            check_p2p_pair(slot, 0, 3, tag=100)
            check_p2p_pair(slot, 3, 1, tag=200)
        with checks.step("subgroups: created in the same order after the join"):
            g_a = dist.new_group([0, 3])
            g_b = dist.new_group([1, 2, 3])
            if slot in (0, 3):
                check_all_reduce({0, 3}, 5, slot, group=g_a)
            if slot in (1, 2, 3):
                check_all_reduce({1, 2, 3}, 6, slot, group=g_b)
                t = torch.full((33,), slot * 11, dtype=torch.int64)
                dist.broadcast(t, src=3, group=g_b)
                assert t.eq(33).all(), f"broadcast from 3 in [1, 2, 3] gave {t[:4].tolist()}..."
        if slot == 0:
            ctx.signal("launch_joiner")
        _scale_up(ctx, checks, proc, slot, MAX)

    def final():
        if proc == 0:
            for ev in ("launch_replacement", "launch_joiner"):
                if not ctx.signalled(ev):
                    ctx.signal(ev)
            last_out(ctx, [1, 2, 4, 5])
        else:
            leave(ctx, checks)

    return run_guarded(checks, body, final)


def _scale_up(ctx, checks, proc, slot, MAX):
    P = pg()
    if proc == 5:
        if ctx.signalled("abort"):
            return
        with checks.step("scaleup: init slot 4 with is_extension=True"):
            init(ctx, 4, MAX, options(MAX, True))
        with checks.step("scaleup: join_group returns once active"):
            ctx.signal("joiner_joining")
            join_group(dist.group.WORLD, timeout_s=STEP_S)
            got = mask()
            assert got == mask_of({0, 1, 2, 3, 4}, MAX), f"get_active_ranks {got} after join_group"
    elif slot in (0, 1):
        # Both propose (activate_ranks and its alias recover_ranks) at about the same time.
        with checks.step("scaleup: redundant activate_ranks/recover_ranks from two ranks"):
            wait_event(ctx, "joiner_joining")
            wait_peers_ready(ctx, [4])
            if slot == 0:
                P.activate_ranks(dist.group.WORLD, [4])
            else:
                P.recover_ranks(dist.group.WORLD, [4])
            got = mask()
            assert got == mask_of({0, 1, 2, 3, 4}, MAX), f"get_active_ranks {got} after activating 4"
    else:
        with checks.step("scaleup: others see slot 4 active"):
            wait_mask(ctx, mask_of({0, 1, 2, 3, 4}, MAX))
        if slot == 2:
            with checks.step("scaleup: repeated activate_ranks of an active rank is harmless"):
                P.activate_ranks(dist.group.WORLD, [4])
                got = mask()
                assert got == mask_of({0, 1, 2, 3, 4}, MAX), f"get_active_ranks {got} after a repeat"
    with checks.step("scaleup: world size 4 -> 5", fatal=False):
        assert dist.get_world_size() == 5, f"dist.get_world_size() {dist.get_world_size()}"
    with checks.step("scaleup: all_reduce over the 5 ranks"):
        check_all_reduce({0, 1, 2, 3, 4}, 7, slot)
    # Then a stall of slot 2 in the default mode leaves a hole below the top.
    _phase_stall(ctx, checks, "default", slot, 2, {0, 1, 2, 3, 4}, MAX, salt=8)


def _job_holes(ctx):
    """Default mode, max_group_size 4, 4 founders: deactivate 1 and 3 -> [1, 0, 1, 0];
    then 1 and 3 rejoin in place (same processes) and are recovered."""
    checks = Checks(ctx)
    P = pg()
    slot, MAX = ctx.rank, 4

    def body():
        with checks.step("holes/bootstrap"):
            init(ctx, slot, 4, options(MAX))
            check_all_reduce({0, 1, 2, 3}, 1, slot)
        with checks.step("holes: deactivate_ranks([1, 3]) -> [1, 0, 1, 0]"):
            if slot == 0:
                P.deactivate_ranks(dist.group.WORLD, [1, 3])
                assert mask() == [1, 0, 1, 0], f"get_active_ranks {mask()} after deactivate_ranks returned"
            else:
                wait_mask(ctx, [1, 0, 1, 0])
        if slot in (0, 2):
            with checks.step("holes: dist.get_world_size() == 3 with [1, 0, 1, 0]", fatal=False):
                assert dist.get_world_size() == 3, f"dist.get_world_size() {dist.get_world_size()}"
            with checks.step("holes: collectives skip the hole"):
                check_all_reduce({0, 2}, 2, slot)
                t = torch.full((65,), 555 if slot == 2 else -1, dtype=torch.int64)
                dist.broadcast(t, src=2)
                assert t.eq(555).all(), f"broadcast from 2 gave {t[:4].tolist()}..."
                dist.barrier()
                check_all_reduce({0, 2}, 3, slot)
            ctx.signal(f"holes_done_{slot}")
        wait_all(ctx, "holes_done", [0, 2])
        # In-place rejoin, one slot at a time: 1 first, then 3.
        for r, active in ((1, {0, 1, 2}), (3, {0, 1, 2, 3})):
            name = f"rejoin: rank {r} rejoins in place and is recovered"
            with checks.step(name):
                if slot == r:
                    t0 = time.monotonic()
                    ctx.signal(f"rejoin_{r}_joining")
                    join_group(dist.group.WORLD, timeout_s=STEP_S)
                    checks.numbers[f"rejoin_{r}_join_group_s"] = round(time.monotonic() - t0, 3)
                    assert mask() == mask_of(active, MAX), f"get_active_ranks {mask()} after join_group"
                elif slot == 0:
                    wait_event(ctx, f"rejoin_{r}_joining")
                    wait_peers_ready(ctx, [r])
                    P.recover_ranks(dist.group.WORLD, [r])
                    assert mask() == mask_of(active, MAX), f"get_active_ranks {mask()} after recover_ranks"
                elif slot in active:
                    wait_mask(ctx, mask_of(active, MAX))
            if slot in active:
                with checks.step(f"rejoin: size {max(active) + 1} after rank {r} is back", fatal=False):
                    assert dist.get_world_size() == max(active) + 1, f"dist.get_world_size() {dist.get_world_size()}"
                with checks.step(f"rejoin: all_reduce with rank {r} back"):
                    check_all_reduce(active, 10 + r, slot)

    def final():
        if slot != 0:
            leave(ctx, checks)
        else:
            last_out(ctx, [1, 2, 3])

    return run_guarded(checks, body, final)


def _job_join_timeout(ctx):
    """2 founders (max_group_size 3); slot 2 calls join_group and nobody activates it.
    Its join_group must fail (not hang) with an error about activation; a second
    join_group that rank 0 does activate then succeeds."""
    checks = Checks(ctx)
    P = pg()
    proc, MAX = ctx.rank, 3

    def body():
        if proc < 2:
            with checks.step("jointimeout/bootstrap"):
                init(ctx, proc, 2, options(MAX))
                check_all_reduce({0, 1}, 1, proc)
            ctx.signal(f"up_{proc}")
        else:
            wait_all(ctx, "up", [0, 1])
            with checks.step("jointimeout: init slot 2 with is_extension=True"):
                init(ctx, 2, MAX, options(MAX, True))
            with checks.step("jointimeout: join_group with nobody activating fails with a clear error"):
                t0 = time.monotonic()
                err = None
                try:
                    join_group(dist.group.WORLD, timeout_s=JOIN_TIMEOUT_S)
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {e}"
                took = time.monotonic() - t0
                checks.numbers["join_timeout_s"] = round(took, 3)
                assert err is not None, f"join_group returned after {took:.1f} s although nobody activated slot 2"
                assert "activat" in err.lower(), f"join_group error does not mention activation: {err}"
                assert took >= 0.9 * JOIN_TIMEOUT_S, f"join_group gave up after {took:.1f} s, before its {JOIN_TIMEOUT_S} s timeout"
                assert took <= JOIN_TIMEOUT_S + SLACK_S, f"join_group took {took:.1f} s, timeout {JOIN_TIMEOUT_S} s"
            with checks.step("jointimeout: slot 2 still inactive after the failed join", fatal=False):
                assert mask() == [1, 1, 0], f"get_active_ranks {mask()}"
            ctx.signal("join_failed")
        if proc < 2:
            with checks.step("jointimeout: nobody else sees slot 2 active meanwhile", fatal=False):
                wait_event(ctx, "join_failed", timeout_s=JOB_TIMEOUT_S)
                assert mask() == [1, 1, 0], f"get_active_ranks {mask()}"
            # The second join must not start before the check above ran: on a
            # slow machine it could otherwise already be activated when we look.
            ctx.signal(f"checked_inactive_{proc}")
        with checks.step("jointimeout: a later join_group that is activated succeeds"):
            if proc == 2:
                wait_all(ctx, "checked_inactive", [0, 1])
                ctx.signal("join_again")
                join_group(dist.group.WORLD, timeout_s=STEP_S)
            elif proc == 0:
                wait_event(ctx, "join_again")
                wait_peers_ready(ctx, [2])
                P.activate_ranks(dist.group.WORLD, [2])
            else:
                wait_mask(ctx, [1, 1, 1])
            assert mask() == [1, 1, 1], f"get_active_ranks {mask()}"
            check_all_reduce({0, 1, 2}, 2, proc)

    def final():
        if proc != 0:
            leave(ctx, checks)
        else:
            last_out(ctx, [1, 2])

    return run_guarded(checks, body, final)


# =============================================================================== jobs, cached

_jobs = {}


def _run(name, backend):
    kw = dict(timeout_s=JOB_TIMEOUT_S, env=ELASTIC_ENV, init=False, ref_group=False)
    if name in ("default", "deferred", "framework"):
        job, n, kw = _job_modes, 4, dict(kw, args=(name,), expect_killed=[3])
    elif name == "replace":
        job, n = _job_replace, 6
        kw = dict(kw, expect_killed=[3], late={4: "launch_replacement", 5: "launch_joiner"})
    elif name == "holes":
        job, n = _job_holes, 4
    elif name == "jointimeout":
        job, n = _job_join_timeout, 3
    else:
        raise KeyError(name)
    return run_job_once(_jobs, (name, backend), backend, job, n, **kw)


_expect = expect_checks


# =============================================================================== tests

@pytest.mark.parametrize("fault", ["kill", "stall"])
@pytest.mark.parametrize("mode", ["default", "deferred", "framework"])
def test_failure_handling(backend, mode, fault):
    """Survivors' op fails in time with local_success False / failed_ranks_hint; after the
    mode's step the bad rank is inactive and the survivors' next all_reduce is exact."""
    job = _run(mode, backend)
    _expect(job, f"{mode}/{fault}")


def test_failure_in_wider_group_default_mode(backend):
    """The replacement job's own kill of rank 3 (max_group_size 8), and a later stall
    of rank 2 among 5 active ranks that leaves a hole (size stays 5)."""
    job = _run("replace", backend)
    _expect(job, "default/")


def test_replacement_rejoins_dead_slot(backend):
    _expect(_run("replace", backend), "replace:")


def test_subgroups_after_join(backend):
    _expect(_run("replace", backend), "subgroups:")


def test_scale_up_into_reserved_slot_with_redundant_activation(backend):
    _expect(_run("replace", backend), "scaleup:")


def test_holes_are_skipped(backend):
    _expect(_run("holes", backend), "holes")


def test_in_place_rejoin(backend):
    _expect(_run("holes", backend), "rejoin:")


def test_join_group_without_activation_fails_clearly(backend):
    _expect(_run("jointimeout", backend), "jointimeout")


def test_processes_leave_cleanly(backend):
    """Every process that was not killed leaves with destroy_process_group (no error).
    A job that failed as a whole fails this test too: it never showed a clean exit."""
    failed = []
    for name in ("default", "deferred", "framework", "replace", "holes", "jointimeout"):
        job = _run(name, backend)
        if job["error"] is not None:
            failed.append(f"job {name!r} failed as a whole, so its exits were never checked:\n"
                          f"{job['error']}")
            continue
        _expect(job, "leave:")
    if failed:
        pytest.fail("\n\n".join(failed), pytrace=False)
