"""Helpers for the elastic-membership scenarios (test_elastic_scenarios.py, benchmarks/elastic_bench.py).

Everything here uses the documented public API only (seed 000 / control-plane.md):
MooncakeBackendOptions overloads, pg.join_group / activate_ranks / recover_ranks /
deactivate_ranks / sync_after_failure / get_active_ranks / get_peer_state /
get_num_synced_ranks, and the Work accessors local_success / failed_ranks_hint.

Processes coordinate through the harness's file events (ctx.signal / ctx.wait_for),
never through a process group that a failure could break. A failing step on any
process sets the "abort" event, so the others stop waiting instead of hanging.
"""

from __future__ import annotations

import os
import re
import time
import traceback

import torch
import torch.distributed as dist

# Small timeouts keep the suite fast; both knobs are honoured by the backend.
TIMEOUT_MS = 3000   # MC_PG_TIMEOUT_MS: per-op (collective) deadline
WINDOW_MS = 4000    # MC_PG_RECONCILE_WINDOW_MS: reconciliation window
# 256 KiB chunks: big_input's all_reduce takes 64 rounds, so a rank that looks
# at its output after the first one and then dies is far from done (with 4
# rounds it once finished its part in between under load, and nobody failed).
ELASTIC_ENV = {"MC_PG_TIMEOUT_MS": str(TIMEOUT_MS), "MC_PG_RECONCILE_WINDOW_MS": str(WINDOW_MS),
               "MC_PG_CHUNK_BYTES": str(256 << 10)}
# Scheduling slack on a loaded 2-core machine, added to every time bound.
SLACK_S = 6.0
# How long a process waits for another one's step (file event, mask change).
STEP_S = 60.0

MODES = {
    # name: (auto_deactivate_on_failure, auto_sync_on_failure)
    "default": (True, True),
    "deferred": (True, False),
    "framework": (False, False),
}


class Abort(Exception):
    """Another process failed a step; this one stops instead of waiting forever."""


def pg():
    from mooncake import pg as _pg
    return _pg


def options(max_group_size, is_extension=False, mode="default"):
    """MooncakeBackendOptions through the seed-000 forms (2-arg for the default mode)."""
    P = pg()
    if mode == "default":
        return P.MooncakeBackendOptions(max_group_size, is_extension)
    auto_deactivate, auto_sync = MODES[mode]
    return P.MooncakeBackendOptions(max_group_size, is_extension, auto_deactivate, auto_sync)


def init(ctx, rank, world_size, pg_options, port=None):
    """init_process_group(mooncake-cpu) as group rank `rank` (not necessarily ctx.rank)."""
    ctx.note(f"init rank={rank} world_size={world_size} {pg_options!r}")
    kwargs = dict(backend=ctx.backend, rank=rank, world_size=world_size, pg_options=pg_options)
    if port is None:
        kwargs["init_method"] = "env://"
    else:
        kwargs["init_method"] = f"tcp://127.0.0.1:{port}"
    dist.init_process_group(**kwargs)


# ----------------------------------------------------------------------------- events

def wait_event(ctx, name, timeout_s=STEP_S):
    deadline = time.monotonic() + timeout_s
    while True:
        if ctx.signalled("abort"):
            raise Abort(f"while waiting for {name!r}: {ctx.event_payload('abort')}")
        if ctx.signalled(name):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"event {name!r} was not signalled within {timeout_s:g} s")
        time.sleep(0.01)


def wait_all(ctx, prefix, ids, timeout_s=STEP_S):
    for i in ids:
        wait_event(ctx, f"{prefix}_{i}", timeout_s)


class Checks:
    """Named checks of one process: name -> None (passed) or the failure text.

    `step(name)` is a context manager; an exception inside marks the check failed,
    sets the abort event (unless it is an Abort itself) and stops the phase by
    re-raising PhaseFailed. `run(phases)` runs phases in order; after a failed
    phase the remaining checks of this process are not run.
    """

    class PhaseFailed(Exception):
        pass

    def __init__(self, ctx):
        self.ctx = ctx
        self.results = {}
        self.numbers = {}

    def step(self, name, fatal=True):
        """fatal=False: a failure is recorded but the phase goes on (an observation)."""
        checks = self

        class _Step:
            def __enter__(self):
                checks.ctx.note(f"check {name}")
                return self

            def __exit__(self, et, e, tb):
                if et is None:
                    checks.results.setdefault(name, None)
                    return False
                if isinstance(e, Abort):
                    checks.results[name] = f"not run: {e}"
                else:
                    text = f"{et.__name__}: {e}\n{''.join(traceback.format_tb(tb))[-2500:]}"
                    checks.results[name] = text
                    checks.ctx.note(f"FAIL {name}: {text[:300]}")
                    if not fatal:
                        return True
                    if not checks.ctx.signalled("abort"):
                        checks.ctx.signal("abort", f"proc {checks.ctx.rank} failed {name}: {et.__name__}: {e}"[:2000])
                raise Checks.PhaseFailed(name)

        return _Step()

    def out(self):
        return {"checks": self.results, "numbers": self.numbers}


def run_guarded(checks, body, final=None):
    """Runs body(), then final() (always); a failed step ends body. Returns checks.out()."""
    try:
        body()
    except Checks.PhaseFailed:
        pass
    except Abort as e:
        checks.results.setdefault("_aborted", f"not run: {e}")
    if final is not None:
        try:
            final()
        except (Checks.PhaseFailed, Abort):
            pass
    return checks.out()


# ----------------------------------------------------------------------------- work outcome

def _accessor(work, name):
    v = getattr(work, name)
    return v() if callable(v) else v


def _described(e):
    """(type name, is a DistBackendError, message) of an exception, or None."""
    if e is None:
        return None
    return (type(e).__name__, isinstance(e, dist.DistBackendError), str(e))


def work_facts(work, error):
    """Everything a caller can read from a completed Work whose wait() raised `error`
    (None: wait() returned): the Work accessors, exception() and the future's outcome."""
    facts = {"error": _described(error)}
    facts["is_completed"] = bool(work.is_completed())
    facts["is_success"] = bool(work.is_success())
    facts["exception"] = _described(work.exception())
    fut = work.get_future()
    # wait() has returned or raised: the future must be complete already.
    facts["future_done"] = bool(fut.done())
    try:
        fut.wait()
        facts["future_error"] = None
    except Exception as e:  # noqa: BLE001 - a failed Work's future holds its error
        facts["future_error"] = _described(e)
    facts["local_success"] = bool(_accessor(work, "local_success"))
    facts["hint"] = _accessor(work, "failed_ranks_hint")
    return facts


def wait_facts(work, sync=False):
    """work.wait(), then work_facts(); the exception wait() raised is kept, not swallowed.
    sync: then work.synchronize() too, which is where a CUDA kernel call that fails
    after wait() returned (wait() only orders the stream) reports its failure."""
    error = None
    try:
        work.wait()
        if sync:
            work.synchronize()
    except Exception as e:  # noqa: BLE001 - a failed op raises from wait(); checked by the caller
        error = e
    return work_facts(work, error)


def outcome(work, started, sync=False):
    """Waits for `work` and reads what a failed Work offers (work_facts), plus the time."""
    res = wait_facts(work, sync)
    res["elapsed_s"] = time.monotonic() - started
    return res


# "[failed ranks: 1 3]": the ranks the failure message names as the evidence.
FAILED_RANKS_RE = re.compile(r"\[failed ranks:((?: \d+)+)\]")


def check_failed_work(res, max_group_size, hint_ranks, message_re, future_fails=True):
    """The documented contract of a failed Work (pg-elastic.md, Failure modes):
    wait() raises DistBackendError whose message matches `message_re`;
    is_completed() True, is_success() False, exception() and the future's error
    are that same DistBackendError; local_success() False; failed_ranks_hint()
    an int32 tensor of max_group_size entries marking exactly `hint_ranks`.
    future_fails=False: a CUDA kernel call's Work (pg-cuda.md), whose Future
    completed when its kernels were queued, as NCCL's does, so it holds no error;
    None: a kernel call that may also have failed before its kernels were queued
    (the direct path's host exchange), which fails the Future too."""
    err = res["error"]
    assert err is not None, "wait() returned normally; expected a DistBackendError"
    name, is_backend_error, message = err
    assert is_backend_error, f"wait() raised {name}: {message[:300]}; expected torch.distributed.DistBackendError"
    assert re.search(message_re, message), f"wait()'s message does not match {message_re!r}: {message[:500]}"
    assert res["is_completed"] is True, "is_completed() is False after wait() raised"
    assert res["is_success"] is False, "is_success() is True for a failed Work"
    assert res["exception"] == err, f"exception() is {res['exception']}, expected what wait() raised: {err}"
    assert res["future_done"] is True, "get_future().done() is False after wait() raised"
    if future_fails is None:
        # Either: the failure came before the kernels were queued (the
        # Future fails with it) or after (the Future had completed).
        assert res["future_error"] in (None, err), (
            f"get_future().wait() raised {res['future_error']}, expected None or {err}")
    else:
        want_future = err if future_fails else None
        assert res["future_error"] == want_future, (
            f"get_future().wait() raised {res['future_error']}, expected {want_future}")
    assert res["local_success"] is False, f"local_success() is True for a failed Work ({message[:200]})"
    hint = res["hint"]
    assert isinstance(hint, torch.Tensor), f"failed_ranks_hint is {type(hint)}, expected a tensor"
    assert hint.dtype == torch.int32, f"failed_ranks_hint dtype {hint.dtype}, expected int32"
    assert hint.numel() == max_group_size, (
        f"failed_ranks_hint has {hint.numel()} entries, expected max_group_size={max_group_size}")
    want = [1 if r in hint_ranks else 0 for r in range(max_group_size)]
    assert hint.tolist() == want, f"failed_ranks_hint {hint.tolist()}, expected {want}"


def check_failed_op(res, bad, max_group_size, self_rank, bound_s, future_fails=True):
    """A survivor's op failed because rank `bad` died or stalled: the failed-Work
    contract, the message names exactly `bad` (and nothing else), in time."""
    check_failed_work(res, max_group_size, {bad}, FAILED_RANKS_RE, future_fails)
    named = sorted(int(r) for r in FAILED_RANKS_RE.search(res["error"][2]).group(1).split())
    assert named == [bad], f"the message names failed ranks {named}, expected [{bad}]: {res['error'][2][:400]}"
    assert self_rank != bad
    assert res["elapsed_s"] <= bound_s, (
        f"the failed op took {res['elapsed_s']:.2f} s, bound {bound_s:.1f} s")


# ----------------------------------------------------------------------------- membership

def join_group(group, timeout_s=None):
    """pg.join_group(group), with this build's optional `timeout` (seconds) when given."""
    import inspect
    fn = pg().join_group
    if timeout_s is not None:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        if "timeout" in params:
            return fn(group, timeout=timeout_s)
    return fn(group)


def mask(group=None):
    return [int(x) for x in pg().get_active_ranks(group or dist.group.WORLD).cpu().tolist()]


MASK_WAIT_S = 20.0  # a committed view reaches every member well within this


def wait_mask(ctx, want, timeout_s=MASK_WAIT_S, group=None, match=None):
    """Polls get_active_ranks until it equals `want` (views are applied asynchronously).

    With `match`, until match(mask) holds instead (`want` then only names it).
    """
    deadline = time.monotonic() + timeout_s
    got = mask(group)
    while not (match(got) if match else got == want):
        if ctx.signalled("abort"):
            raise Abort(f"while waiting for mask {want}: {ctx.event_payload('abort')}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"get_active_ranks is {got}, expected {want} within {timeout_s:g} s")
        time.sleep(0.01)
        got = mask(group)
    return got


def mask_of(active, max_group_size):
    return [1 if r in active else 0 for r in range(max_group_size)]


def wait_peers_ready(ctx, ranks, timeout_s=STEP_S, group=None):
    """The documented healthy-side loop: poll get_peer_state until all are ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = list(pg().get_peer_state(group or dist.group.WORLD, list(ranks)))
        if len(state) != len(ranks):
            raise AssertionError(f"get_peer_state({list(ranks)}) returned {state}")
        if all(state):
            return
        if ctx.signalled("abort"):
            raise Abort(f"while polling get_peer_state({list(ranks)}): {ctx.event_payload('abort')}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"get_peer_state({list(ranks)}) still {state} after {timeout_s:g} s")
        time.sleep(0.02)


# ----------------------------------------------------------------------------- data checks

def value_of(rank, salt):
    """Distinct small integers per (rank, salt): sums are exact in int64."""
    return (rank + 1) * 1000 + salt


def check_all_reduce(active, salt, rank, n=257, group=None):
    t = torch.full((n,), value_of(rank, salt), dtype=torch.int64)
    dist.all_reduce(t, group=group)
    want = sum(value_of(r, salt) for r in active)
    bad = (t != want).nonzero()
    assert bad.numel() == 0, (
        f"all_reduce over {sorted(active)} (salt {salt}): {bad.numel()} of {n} entries wrong, "
        f"first t[{int(bad[0])}]={int(t[int(bad[0])])}, expected {want}")


def payload(src, dst, tag, n=1031):
    return torch.arange(n, dtype=torch.int64) * 7 + src * 100003 + dst * 1009 + tag


def check_p2p_pair(rank, a, b, tag, n=1031):
    """a <-> b: a sends then receives, b receives then sends; exact payloads."""
    if rank == a:
        dist.send(payload(a, b, tag, n), b, tag=tag)
        out = torch.zeros(n, dtype=torch.int64)
        dist.recv(out, b, tag=tag + 1)
        assert torch.equal(out, payload(b, a, tag + 1, n)), f"recv from {b} (tag {tag + 1}) has wrong data"
    elif rank == b:
        out = torch.zeros(n, dtype=torch.int64)
        dist.recv(out, a, tag=tag)
        assert torch.equal(out, payload(a, b, tag, n)), f"recv from {a} (tag {tag}) has wrong data"
        dist.send(payload(b, a, tag + 1, n), a, tag=tag + 1)


def big_input(rank, numel=4 << 20):
    """16 MiB of int32 for the collective a rank is killed in the middle of."""
    return torch.full((numel,), rank + 1, dtype=torch.int32)


def die_inside_all_reduce(ctx, slot, active, event):
    """SIGKILLs this process in the middle of an all_reduce of big_input over
    `active` (the others entered it already). Once the first chunk of the output
    holds the sum, every rank is inside the call; the last element still holding
    this rank's own input shows that the call is not over. `event` records
    whether that held when the kill was sent (check_died_inside reads it)."""
    # The event exists (empty) before the call; its text is one write() right
    # before the kill, so little can happen between the look and the kill.
    ctx.signal(event, "")
    fd = os.open(ctx.event_path(event), os.O_WRONLY)
    t = big_input(slot)
    work = dist.all_reduce(t, async_op=True)
    total = sum(r + 1 for r in active)
    deadline = time.monotonic() + STEP_S
    while int(t[0]) != total and not work.is_completed() and time.monotonic() < deadline:
        pass
    midway = int(t[0]) == total and int(t[-1]) == slot + 1 and not work.is_completed()
    os.write(fd, b"midway" if midway else
             f"not midway: t[0]={int(t[0])} t[-1]={int(t[-1])}".encode())
    ctx.kill_self()


def check_died_inside(ctx, victim, event):
    wait_event(ctx, event)
    at = ctx.event_payload(event)
    assert at == "midway", f"rank {victim} was not killed in the middle of the all_reduce ({at})"


def leave(ctx, checks, name="leave: destroy_process_group"):
    """destroy_process_group inside the test (a hang or error is a named check), then
    tells the store / Coordinator host (process 0) that this process is done."""
    try:
        if dist.is_initialized():
            with checks.step(name, fatal=False):
                dist.destroy_process_group()
    finally:
        ctx.signal(f"left_{ctx.rank}")


def last_out(ctx, procs, timeout_s=STEP_S):
    """Process 0 (TCPStore server, Coordinator) returns after the others have left."""
    for p in procs:
        deadline = time.monotonic() + timeout_s
        while not ctx.signalled(f"left_{p}"):
            if time.monotonic() >= deadline:
                ctx.note(f"process {p} did not leave within {timeout_s:g} s")
                return
            time.sleep(0.01)


def env_pid_note(ctx, what):
    ctx.note(f"{what} pid={os.getpid()}")


# ----------------------------------------------------------------------------- job results

def expect_checks(job, prefix, procs=None):
    """Every check whose name starts with `prefix` passed on every process that ran it.
    `job` is {"procs": run_ranks results or None, "error": text or None, "wall_s": s}."""
    import pytest  # only the test modules call this (benchmarks import this file too)
    if job["error"] is not None:
        pytest.fail(f"the job failed as a whole:\n{job['error']}", pytrace=False)
    seen, failures = 0, []
    for p, res in enumerate(job["procs"]):
        if not isinstance(res, dict) or (procs is not None and p not in procs):
            continue
        for name, err in res["checks"].items():
            if name == "_aborted" or name.startswith(prefix):
                if name != "_aborted":
                    seen += 1
                if err is not None:
                    failures.append(f"proc {p}: [{name}] {err}")
    numbers = {p: r["numbers"] for p, r in enumerate(job["procs"]) if isinstance(r, dict) and r["numbers"]}
    if failures:
        pytest.fail("\n".join(failures) + f"\nnumbers: {numbers}", pytrace=False)
    assert seen, f"no check named {prefix!r}... ran (an earlier step failed?)"
    print(f"{prefix}: {seen} checks passed; numbers {numbers}; job wall {job['wall_s']} s")


def run_job_once(cache, key, backend, job, nprocs, **run_ranks_kw):
    """Runs `job` on `nprocs` processes (harness.run_ranks with `run_ranks_kw`) the
    first time `key` is asked for, and keeps {"procs", "error", "wall_s"} in the test
    module's `cache` for every test that reads the job (expect_checks): a job that
    failed as a whole is kept as its error. Skips where the backend has no elastic
    membership."""
    import harness  # tests only: elastic_bench.py imports this module without it
    import pytest

    if not harness.is_mooncake(backend):
        pytest.skip("elastic membership is a mooncake-cpu feature (gloo has none)")
    if key not in cache:
        t0 = time.monotonic()
        try:
            out = {"procs": harness.run_ranks(job, nprocs, backend, **run_ranks_kw), "error": None}
        except harness.WorkersFailed as e:
            out = {"procs": None, "error": str(e)}
        out["wall_s"] = round(time.monotonic() - t0, 1)
        cache[key] = out
    return cache[key]
