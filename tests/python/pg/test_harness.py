"""The multi-process harness itself: errors, hangs and deaths are reported, not swallowed."""

import os
import re
import time

import pytest

import harness


def _misbehave(ctx):
    # Ranks 1 and 2 fail only once rank 0 is hanging, so the 3 s grace never
    # has to cover a slow start of rank 0 on a loaded machine.
    if ctx.rank == 0:
        ctx.note("about to hang")
        ctx.signal("hanging")
        time.sleep(1000)
    ctx.wait_for("hanging", 60)
    if ctx.rank == 1:
        raise ValueError("boom from rank 1")
    if ctx.rank == 2:
        os._exit(3)
    return "unreachable"


def test_error_hang_and_death_are_reported():
    with pytest.raises(harness.WorkersFailed) as info:
        harness.run_ranks(_misbehave, 3, "gloo", timeout_s=60, init=False, grace_s=3)
    text = str(info.value)
    assert "rank 1 raised ValueError: boom from rank 1" in text
    assert "_misbehave" in text                       # the worker's traceback
    assert "rank 0 HUNG" in text and "about to hang" in text
    assert "_misbehave" in text.split("rank 0 HUNG")[1]   # python stack of the hung rank
    assert "rank 2 died without reporting a result (exit code 3)" in text
    # The watchdog cut its wait short because rank 1 or 2 failed (a condition,
    # not a duration: gdb on the hung rank takes long on a loaded machine).
    head = text.splitlines()[0]
    assert re.search(r"rank [12] failed first", head), head


def _fail_on_zero(ctx):
    if ctx.rank == 0:
        raise RuntimeError("expected: bad root 7")
    return 7


def test_expected_failures():
    res = harness.run_ranks(_fail_on_zero, 2, "gloo", timeout_s=60, init=False,
                            expect_fail={0: r"RuntimeError: expected: bad root \d"})
    assert isinstance(res[0], harness.RankError) and res[0].rank == 0 and "bad root 7" in res[0].message
    assert res[1] == 7
    with pytest.raises(harness.WorkersFailed, match="was expected to fail"):
        harness.run_ranks(_fail_on_zero, 2, "gloo", timeout_s=60, init=False, expect_fail=r"bad root")


def _late_and_killed(ctx):
    # proc 0 kills itself once proc 2 (late) is running; proc 1 waits for both.
    if ctx.rank == 0:
        ctx.signal("start_late", "hello")
        ctx.wait_for("late_running", 60)
        ctx.kill_self()
    if ctx.rank == 1:
        ctx.wait_for("late_running", 60)
        return "waited"
    if ctx.rank == 2:
        assert ctx.event_payload("start_late") == "hello"
        ctx.signal("late_running")
        return os.getpid()
    return None


def test_late_process_and_expected_kill():
    res = harness.run_ranks(_late_and_killed, 3, "gloo", timeout_s=60, init=False,
                            late={2: "start_late"}, expect_killed=[0])
    assert isinstance(res[0], harness.Killed) and res[0].signal == "SIGKILL"
    assert res[1] == "waited" and isinstance(res[2], int)


def _never_signals(ctx):
    return ctx.rank


def test_late_process_never_started_and_unexpected_survival():
    with pytest.raises(harness.WorkersFailed) as info:
        harness.run_ranks(_never_signals, 3, "gloo", timeout_s=30, init=False,
                          late={2: "never"}, expect_killed=[1])
    text = str(info.value)
    assert "rank 2 was never started" in text and "'event.never'" in text
    assert "rank 1 was expected to be killed by a signal" in text
