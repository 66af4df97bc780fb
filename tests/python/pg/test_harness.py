"""The multi-process harness itself: errors, hangs and deaths are reported, not swallowed."""

import os
import time

import pytest

import harness


def _misbehave(ctx):
    if ctx.rank == 0:
        ctx.note("about to hang")
        time.sleep(1000)
    if ctx.rank == 1:
        raise ValueError("boom from rank 1")
    if ctx.rank == 2:
        os._exit(3)
    return "unreachable"


def test_error_hang_and_death_are_reported():
    t0 = time.monotonic()
    with pytest.raises(harness.WorkersFailed) as info:
        harness.run_ranks(_misbehave, 3, "gloo", timeout_s=60, init=False, grace_s=3)
    took = time.monotonic() - t0
    text = str(info.value)
    assert "rank 1 raised ValueError: boom from rank 1" in text
    assert "_misbehave" in text                       # the worker's traceback
    assert "rank 0 HUNG" in text and "about to hang" in text
    assert "_misbehave" in text.split("rank 0 HUNG")[1]   # python stack of the hung rank
    assert "rank 2 died without reporting a result (exit code 3)" in text
    assert took < 40, f"the failure of rank 1 should cut the wait short (took {took:.1f} s)"


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
