"""Which backend and transport a test run covers, and what its workers inherit.

Split from harness.py, which re-exports every name here: the backend under
test ($MC_TEST_BACKEND), importing a backend's module, the transport of the
mooncake backends' workers (`set_transport`), free ports and the workers'
environment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Mapping, Optional

BACKEND_ENV = "MC_TEST_BACKEND"
DEFAULT_BACKEND = "mooncake-cpu"
BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(REPO_ROOT, "python")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------- backends

def backends_under_test() -> list:
    """Backends named by $MC_TEST_BACKEND (comma-separated), default mooncake-cpu."""
    raw = os.environ.get(BACKEND_ENV, "") or DEFAULT_BACKEND
    return [b.strip() for b in raw.split(",") if b.strip()]


def backend_under_test() -> str:
    return backends_under_test()[0]


def is_builtin(backend: str) -> bool:
    return backend in BUILTIN_BACKENDS


def is_mooncake(backend: str) -> bool:
    return backend.startswith("mooncake")


def import_backend(backend: str) -> None:
    """Registers a non-builtin backend with torch.distributed (mooncake: `from mooncake import pg`)."""
    if is_mooncake(backend):
        from mooncake import pg  # noqa: F401  (registration is the import's side effect)
    elif not is_builtin(backend):
        raise ValueError(f"unknown backend {backend!r}: expected gloo or mooncake-cpu")


_import_checked: dict = {}


def backend_import_error(backend: str) -> Optional[str]:
    """None when `backend` can be imported in a fresh interpreter, else the error text.

    Checked in a subprocess (once per backend per session) so that a broken
    extension cannot take the test runner down with it.
    """
    if is_builtin(backend):
        return None
    if backend not in _import_checked:
        code = "import sys; sys.path.insert(0, sys.argv[1]); from mooncake import pg"
        try:
            proc = subprocess.run([sys.executable, "-c", code, PYTHON_DIR], capture_output=True,
                                  text=True, timeout=120, env=child_env({}))
            err = None if proc.returncode == 0 else (
                f"`from mooncake import pg` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        except subprocess.TimeoutExpired:
            err = "`from mooncake import pg` did not finish within 120 s"
        _import_checked[backend] = err
    return _import_checked[backend]


# --------------------------------------------------------------------------- transports

# Worker environment per transport of the mooncake backends.
TRANSPORTS = {"shm": {}, "tcp": {"MC_FORCE_TCP": "1"}}
_transport = "shm"


def set_transport(name: str) -> None:
    """Transport for the workers of later run_ranks calls (mooncake backends only)."""
    global _transport
    if name not in TRANSPORTS:
        raise ValueError(f"transport {name!r}: expected one of {sorted(TRANSPORTS)}")
    _transport = name


def current_transport() -> str:
    return _transport


def transport_env(backend: str) -> dict:
    """Environment that selects the current transport for `backend`'s workers."""
    return dict(TRANSPORTS[_transport]) if is_mooncake(backend) else {}


# --------------------------------------------------------------------------- ports, env

def _ephemeral_range() -> tuple:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_ports(n: int = 1) -> list:
    """n distinct TCP ports that were free a moment ago.

    Taken below the kernel's ephemeral range when there is room: a test binds
    a port picked here only later, after its processes may have started
    listeners on ports the kernel hands out (transfer engines, stores on port
    0), and a port from the ephemeral range can be taken by one of those in
    between (EADDRINUSE, seen in CI). Checked by binding, then released.
    """
    import random
    low, _ = _ephemeral_range()
    socks = []
    try:
        candidates = random.Random().sample(range(10000, low), min(4 * n + 64, max(0, low - 10000)))
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # no room below the range: let the kernel pick
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def child_env(extra: Mapping[str, Optional[str]]) -> dict:
    """os.environ plus what workers need: python/ and tests/python on PYTHONPATH, 1 thread."""
    env = dict(os.environ)
    paths = [PYTHON_DIR, TESTS_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env
