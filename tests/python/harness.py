"""Multi-process harness for torch.distributed backend tests.

    from harness import run_ranks

    def worker(ctx, n):                       # module level, so `spawn` can pickle it
        t = torch.full((n,), float(ctx.rank))
        dist.all_reduce(t)                    # default group: the backend under test
        ref = torch.full((n,), float(ctx.rank))
        dist.all_reduce(ref, group=ctx.ref)   # the same inputs through gloo
        return t.equal(ref)

    assert run_ranks(worker, 3, "mooncake-cpu", timeout_s=60, args=(8,)) == [True] * 3

`run_ranks` starts `world_size` processes with the `spawn` start method, gives
them a free port for env:// rendezvous, initialises the default group with the
backend under test and a gloo group on the same ranks (`ctx.ref`), calls
`fn(ctx, *args)` on every rank and returns the per-rank results in rank order.

A watchdog kills every worker after `timeout_s` and fails with the ranks that
hung, their Python stacks (faulthandler) and their last progress notes
(`ctx.note`). An exception on a rank is re-raised in the parent as an
AssertionError carrying the rank and the worker's traceback; once one rank has
failed unexpectedly the others get `grace_s` more seconds before they are
killed (they are usually stuck waiting for the failed rank).

Ranks may be expected to fail: `expect_fail` maps rank -> regex (or one regex
for every rank); the worker's "ExceptionType: message" must match (re.search,
re.S). Those ranks then appear in the result list as `RankError` objects.

Elastic scenarios (see tests/python/pg/test_elastic_scenarios.py) need three more
things, all optional:

* `late={proc: "event"}` starts process `proc` only once some process called
  `ctx.signal("event")` (a replacement or a joiner launched after the fact);
  a late process that was never started is reported as a problem.
* `expect_killed=[proc, ...]` processes that are expected to die from a signal
  (e.g. `ctx.kill_self()`, SIGKILL in the middle of a collective); they appear
  in the results as `Killed` objects and do not shorten the others' grace.
* `ctx.signal(name)` / `ctx.wait_for(name, timeout_s)` / `ctx.signalled(name)`:
  file-based events shared by every process of the run (no process group
  needed), e.g. to let a stalled rank sleep until the survivors are done.

With init=False each process does its own init, so a process index (`ctx.rank`,
the position in the result list) need not be its rank in the group.

Transports: `set_transport("tcp")` makes every later run_ranks of a mooncake
backend start its workers with MC_FORCE_TCP=1 (the TCP put path and bounce
ring instead of shared memory) until `set_transport("shm")`; pg/conftest.py
does this for modules marked `both_transports`, once per transport.

The backend under test comes from $MC_TEST_BACKEND (default "mooncake-cpu"; a
comma-separated list runs the tests once per backend). MC_TEST_BACKEND=gloo runs
the suites against gloo, which validates the tests themselves.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from harness_os import enter_netns as _enter_netns, native_stacks as _native_stacks
from harness_env import (
    BACKEND_ENV, BUILTIN_BACKENDS, DEFAULT_BACKEND, PYTHON_DIR, REPO_ROOT, TESTS_DIR, TRANSPORTS,
    backend_import_error, backend_under_test, backends_under_test, child_env, current_transport,
    free_port, free_ports, import_backend, is_builtin, is_mooncake, set_transport, transport_env)

# The public names, harness_env's included (tests use harness.free_port & co.).
__all__ = [
    'BACKEND_ENV', 'BUILTIN_BACKENDS', 'DEFAULT_BACKEND', 'PYTHON_DIR', 'REPO_ROOT', 'TESTS_DIR',
    'TRANSPORTS', 'backend_import_error', 'backend_under_test', 'backends_under_test', 'child_env',
    'current_transport', 'free_port', 'free_ports', 'import_backend', 'is_builtin', 'is_mooncake',
    'set_transport', 'transport_env', 'wait_until', 'RankError', 'Killed', 'Ctx', 'WorkersFailed',
    'run_ranks',
]


def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = 60.0,
               poll_s: float = 0.005) -> None:
    """Polls `pred` until it holds; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)


@contextmanager
def _patched_environ(env: Mapping[str, str]):
    """Spawned children inherit os.environ at start() time: swap it in for the duration."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --------------------------------------------------------------------------- results

@dataclass
class RankError:
    """An exception raised on one rank, as seen by the parent."""
    rank: int
    type: str
    message: str
    traceback: str = ""

    def text(self) -> str:
        return f"{self.type}: {self.message}"

    def matches(self, pattern: str) -> bool:
        return re.search(pattern, self.text(), re.S) is not None

    def __str__(self) -> str:
        return f"rank {self.rank}: {self.text()}"


@dataclass
class Killed:
    """A process that died from a signal, as run_ranks(expect_killed=...) expected."""
    rank: int
    signal: str

    def __str__(self) -> str:
        return f"rank {self.rank}: killed by {self.signal}"


def _event_path(tmpdir: str, name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ValueError(f"event names are [A-Za-z0-9_.-]+, got {name!r}")
    return os.path.join(tmpdir, f"event.{name}")


@dataclass
class Ctx:
    """What a worker function receives as its first argument."""
    rank: int
    world_size: int
    backend: str
    ref: Any = None            # gloo group over all ranks (None when ref_group=False or init=False)
    tmpdir: str = ""           # shared by all ranks of this run; removed afterwards
    port: int = 0              # the MASTER_PORT used for env:// init
    _notes: Any = field(default=None, repr=False)

    @property
    def is_mooncake(self) -> bool:
        return is_mooncake(self.backend)

    def note(self, msg: str) -> None:
        """Progress line; the tail is shown when this rank hangs or fails."""
        if self._notes is not None:
            self._notes.write(f"{time.monotonic():.3f} {msg}\n")
            self._notes.flush()

    # File-based events shared by all processes of one run_ranks call.
    def signal(self, name: str, payload: str = "") -> None:
        """Sets event `name` (idempotent); `payload` is readable with event_payload()."""
        path = _event_path(self.tmpdir, name)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(payload)
        os.replace(tmp, path)
        self.note(f"signal {name}")

    def event_path(self, name: str) -> str:
        return _event_path(self.tmpdir, name)

    def signalled(self, name: str) -> bool:
        return os.path.exists(_event_path(self.tmpdir, name))

    def event_payload(self, name: str) -> str:
        with open(_event_path(self.tmpdir, name)) as f:
            return f.read()

    def wait_for(self, name: str, timeout_s: float, poll_s: float = 0.01) -> None:
        """Blocks until event `name` is set; TimeoutError after timeout_s."""
        self.note(f"wait_for {name}")
        deadline = time.monotonic() + timeout_s
        while not self.signalled(name):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"event {name!r} was not signalled within {timeout_s:g} s")
            time.sleep(poll_s)

    def kill_self(self) -> None:
        """SIGKILLs this process at once (no cleanup); pair with expect_killed."""
        self.note("kill_self (SIGKILL)")
        os.kill(os.getpid(), signal.SIGKILL)

    def init(self, **kwargs) -> None:
        """init_process_group with the backend under test over env:// (for init=False runs)."""
        import torch.distributed as dist
        kwargs.setdefault("backend", self.backend)
        kwargs.setdefault("rank", self.rank)
        kwargs.setdefault("world_size", self.world_size)
        if "store" not in kwargs:
            kwargs.setdefault("init_method", "env://")
        dist.init_process_group(**kwargs)


def _paths(tmpdir: str, rank: int) -> dict:
    return {k: os.path.join(tmpdir, f"{k}.{rank}") for k in ("result", "notes", "stack")}


def _write_result(path: str, payload: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        try:
            pickle.dump(payload, f)
        except Exception as e:  # an unpicklable return value
            f.seek(0)
            f.truncate()
            pickle.dump({"status": "error", "type": "PicklingError",
                         "message": f"worker result is not picklable: {e!r}",
                         "traceback": traceback.format_exc()}, f)
    os.replace(tmp, path)


NETNS_ENV = "MC_TEST_NETNS"


def _worker_main(rank, world_size, backend, fn, args, tmpdir, port, init, ref_group,
                 pg_options, pg_timeout_s):
    if os.environ.get(NETNS_ENV):
        _enter_netns(os.environ[NETNS_ENV])
    paths = _paths(tmpdir, rank)
    stack_file = open(paths["stack"], "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    notes = open(paths["notes"], "w")
    ctx = Ctx(rank=rank, world_size=world_size, backend=backend, tmpdir=tmpdir, port=port, _notes=notes)
    code = 0
    try:
        import torch
        torch.set_num_threads(1)
        import torch.distributed as dist
        import_backend(backend)
        if init:
            kwargs = {}
            if pg_options is not None:
                kwargs["pg_options"] = pg_options(world_size)
            if pg_timeout_s is not None:
                import datetime
                kwargs["timeout"] = datetime.timedelta(seconds=pg_timeout_s)
            ctx.note(f"init_process_group({backend!r}, rank={rank}, world_size={world_size})")
            dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                    world_size=world_size, **kwargs)
            if ref_group:
                ctx.ref = dist.new_group(backend="gloo")
        ctx.note("calling test function")
        value = fn(ctx, *args)
        _write_result(paths["result"], {"status": "ok", "value": value})
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        _write_result(paths["result"], {"status": "error", "type": type(e).__qualname__,
                                        "message": str(e), "traceback": traceback.format_exc()})
        code = 1
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            ctx.note("destroy_process_group")
            dist.destroy_process_group()
        ctx.note("done")
    except BaseException as e:  # noqa: BLE001
        ctx.note(f"destroy_process_group raised {type(e).__name__}: {e}")
        code = code or 2
    notes.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a test is about the code above, not about atexit order.
    os._exit(code)


class WorkersFailed(AssertionError):
    """Raised in the parent when ranks fail unexpectedly, hang, or die."""


def _tail(path: str, limit: int) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _normalise_expect(expect_fail, world_size) -> dict:
    if expect_fail is None:
        return {}
    if isinstance(expect_fail, (str, bool)):
        return {r: expect_fail for r in range(world_size)}
    return dict(expect_fail)


def run_ranks(fn: Callable, world_size: int, backend: str, timeout_s: float,
              env: Optional[Mapping[str, Optional[str]]] = None, args: Sequence = (), *,
              expect_fail: Union[None, str, bool, Mapping[int, Union[str, bool]]] = None,
              init: bool = True, ref_group: bool = True,
              pg_options: Optional[Callable[[int], Any]] = None,
              pg_timeout_s: Optional[float] = None, grace_s: float = 10.0,
              late: Optional[Mapping[int, str]] = None,
              expect_killed: Sequence[int] = (),
              rank_env: Optional[Mapping[int, Mapping[str, str]]] = None,
              netns: Optional[Mapping[int, str]] = None) -> list:
    """Runs fn(ctx, *args) on `world_size` spawned ranks; returns results in rank order.

    env:        extra environment for the workers (None values unset a variable).
    init:       init the default group with `backend` (env://) and, with ref_group,
                a gloo group over all ranks as ctx.ref. With init=False the worker
                does its own init (ctx.init(), ctx.port, MASTER_ADDR/PORT are set).
    pg_options: module-level callable world_size -> pg_options for init_process_group.
    expect_fail: see module docstring; matching ranks return RankError objects.
    late:       {proc: event}: start process `proc` once ctx.signal(event) was called.
    expect_killed: processes expected to die from a signal; they return Killed objects.
    rank_env:   {proc: {VAR: value}}: environment of one process on top of `env`.
    netns:      {proc: name}: the process runs in network namespace `name` (see
                tests/python/pg/netns.py); MASTER_ADDR must then be reachable from it.
    """
    expected = _normalise_expect(expect_fail, world_size)
    tmpdir = tempfile.mkdtemp(prefix="mc_ranks_")
    port = free_port()
    base_env = child_env({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), **transport_env(backend), **(env or {}),
    })
    late = dict(late or {})
    for rank in late:
        if not 0 <= rank < world_size:
            raise ValueError(f"late process {rank} is outside [0, {world_size})")
    spawn = multiprocessing.get_context("spawn")
    procs = []

    rank_env = dict(rank_env or {})
    netns = dict(netns or {})

    def start(rank):
        extra = {**rank_env.get(rank, {}), "RANK": str(rank), "LOCAL_RANK": str(rank)}
        if rank in netns:
            extra[NETNS_ENV] = netns[rank]
        with _patched_environ({**base_env, **extra}):
            procs[rank].start()

    try:
        for rank in range(world_size):
            procs.append(spawn.Process(
                target=_worker_main, name=f"rank{rank}",
                args=(rank, world_size, backend, fn, tuple(args), tmpdir, port, init,
                      ref_group, pg_options, pg_timeout_s)))
        for rank in range(world_size):
            if rank not in late:
                start(rank)
        pending = {rank: _event_path(tmpdir, ev) for rank, ev in late.items()}
        return _supervise(procs, tmpdir, timeout_s, grace_s, expected,
                          pending=pending, start=start, killed=set(expect_killed))
    finally:
        for p in procs:
            if p.pid is None:
                continue
            if p.is_alive():
                p.kill()
            p.join(5)
        shutil.rmtree(tmpdir, ignore_errors=True)


def _read_result(tmpdir, rank):
    try:
        with open(_paths(tmpdir, rank)["result"], "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _supervise(procs, tmpdir, timeout_s, grace_s, expected, pending=None, start=None,
               killed=frozenset()) -> list:
    world_size = len(procs)
    pending = dict(pending or {})  # late processes not started yet: rank -> event file
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    shortened_by = None
    while True:
        for rank, path in list(pending.items()):
            if os.path.exists(path):
                del pending[rank]
                start(rank)
        alive = [p for p in procs if p.pid is not None and p.exitcode is None]
        if not alive:
            break
        now = time.monotonic()
        if shortened_by is None:
            for rank, p in enumerate(procs):
                if p.pid is None or p.exitcode is None or rank in expected or rank in killed:
                    continue
                res = _read_result(tmpdir, rank)
                if res is None or res.get("status") != "ok":
                    shortened_by = rank
                    deadline = min(deadline, now + grace_s)
                    break
        if now >= deadline:
            break
        multiprocessing.connection.wait([p.sentinel for p in alive],
                                        timeout=min(0.05 if pending else 0.2, deadline - now))

    hung = [rank for rank, p in enumerate(procs) if p.pid is not None and p.exitcode is None]
    stacks = {}
    if hung:
        for rank in hung:
            try:
                os.kill(procs[rank].pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.0)
        for rank in hung:
            stacks[rank] = _tail(_paths(tmpdir, rank)["stack"], 4000)
            native = _native_stacks(procs[rank].pid)
            if native:
                stacks[rank] += "\n  native threads (gdb, frames of our code):\n" + native
            procs[rank].kill()
        for rank in hung:
            procs[rank].join(5)
    elapsed = time.monotonic() - t0

    results, problems = [], []
    for rank, p in enumerate(procs):
        res = _read_result(tmpdir, rank)
        notes = _tail(_paths(tmpdir, rank)["notes"], 1500)
        if p.pid is None:
            results.append(None)
            problems.append(f"rank {rank} was never started: its launch event "
                            f"{os.path.basename(pending.get(rank, '?'))!r} was not signalled")
            continue
        if rank in killed:
            if res is None and rank not in hung and p.exitcode is not None and p.exitcode < 0:
                results.append(Killed(rank, _describe_exit(p.exitcode)[len("killed by "):]))
            else:
                what = ("it hung" if rank in hung else
                        f"it reported {res.get('status')!r}" if res is not None else
                        _describe_exit(p.exitcode))
                results.append(None)
                problems.append(f"rank {rank} was expected to be killed by a signal, but {what}"
                                f"\n  last progress notes:\n{_indent(notes)}"
                                + (f"\n  python stacks:\n{_indent(stacks.get(rank, ''))}" if rank in hung else "")
                                + (f"\n{_indent(res.get('traceback', ''))}" if res is not None else ""))
            continue
        if res is None:
            results.append(None)
            if rank in hung:
                problems.append(
                    f"rank {rank} HUNG: no result after {elapsed:.1f} s (watchdog killed it)"
                    f"\n  last progress notes:\n{_indent(notes)}\n  python stacks:\n{_indent(stacks.get(rank, ''))}")
            else:
                problems.append(f"rank {rank} died without reporting a result ({_describe_exit(p.exitcode)})"
                                f"\n  last progress notes:\n{_indent(notes)}")
            continue
        if res["status"] == "ok":
            value = res["value"]
            if rank in expected:
                problems.append(f"rank {rank} was expected to fail (matching {expected[rank]!r}) "
                                f"but returned {value!r:.300}")
            results.append(value)
        else:
            err = RankError(rank, res["type"], res["message"], res["traceback"])
            results.append(err)
            want = expected.get(rank)
            if want is None:
                problems.append(f"rank {rank} raised {err.text()}\n{_indent(err.traceback)}")
            elif want is not True and not err.matches(want):
                problems.append(f"rank {rank} failed as expected, but its error does not match "
                                f"{want!r}:\n  {err.text()}\n{_indent(err.traceback)}")
        if rank in hung:
            problems.append(f"rank {rank} HUNG after reporting its result (in destroy_process_group "
                            f"or exit); last progress notes:\n{_indent(notes)}\n  python stacks:\n"
                            f"{_indent(stacks.get(rank, ''))}")
        elif p.exitcode not in (0, 1) and res is not None:
            problems.append(f"rank {rank} ended with {_describe_exit(p.exitcode)} after its result"
                            f"\n  last progress notes:\n{_indent(notes)}")

    if problems:
        head = f"{len(problems)} problem(s) in a {world_size}-rank run ({elapsed:.1f} s"
        head += f", watchdog {timeout_s:g} s" + (f", rank {shortened_by} failed first" if shortened_by is not None else "") + ")"
        raise WorkersFailed(head + ":\n\n" + "\n\n".join(problems))
    return results


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines()) if text else prefix + "(none)"
