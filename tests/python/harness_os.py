"""What the test harness (harness.py) asks of the operating system: moving a
worker into a network namespace, and a hung worker's native stacks."""

import os
import shutil
import subprocess


def enter_netns(name: str) -> None:
    """Moves this (still single-threaded) process into network namespace `name`
    (`ip netns add`): threads started afterwards inherit it."""
    import ctypes
    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def native_stacks(pid: int, limit: int = 12000) -> str:
    """Every thread's C++ backtrace of a hung worker, via gdb when present:
    Python stacks alone do not show where the backend waits. Keeps the frames
    of our code (and the wait they sit in) so the report stays short."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return ""
    try:
        out = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    keep, threads = [], out.split("\nThread ")
    for t in threads[1:]:
        lines = t.splitlines()
        ours = [ln for ln in lines[1:] if "mooncake" in ln or "pthread_cond" in ln
                or "futex" in ln or "poll" in ln or "nanosleep" in ln]
        idle = any(loop in t for loop in _IDLE_LOOPS)
        if any("mooncake" in ln for ln in ours) and not idle:
            keep.append("Thread " + lines[0] + "\n" + "\n".join(ln[:220] for ln in ours[:14]))
    return "\n".join(keep)[:limit]


# Background threads that wait for work by design; a hang is elsewhere.
_IDLE_LOOPS = ("EventLoop::loop", "ShmServer::step", "LivenessProber::run", "P2PEngine::Impl::run")
