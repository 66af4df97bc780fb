"""One process of the exit scenario run by test_clean_exit.py (not a test itself).

    python exit_scenario.py RANK WORLD EVENT_DIR MODE

Ranks 0..WORLD-1 form a mooncake-cpu group over env:// (MASTER_ADDR/PORT from
the environment). The last rank is SIGKILLed in the middle of an all_reduce
the others already entered: once the first chunk of its output holds the sum
while the last element still holds its own input (it writes which held to the
event "victim"). The survivors wait for the failed completion, run
one more all_reduce among themselves and check its result, and then exit the
way scripts do: MODE "return" falls off the end of the script without
destroy_process_group(), MODE "destroy" calls it first. The parent checks the
exit codes and counts the log lines.
"""

import os
import signal
import sys
import time


def _event(d, name):
    return os.path.join(d, name)


def _signal(d, name):
    with open(_event(d, name) + ".tmp", "w"):
        pass
    os.replace(_event(d, name) + ".tmp", _event(d, name))


def _wait(d, name, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(_event(d, name)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"event {name!r} not signalled within {timeout_s} s")
        time.sleep(0.002)


def main():
    rank, world, events, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import torch
    import torch.distributed as dist
    from mooncake import pg  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    victim = world - 1
    dist.init_process_group(backend="mooncake-cpu", init_method="env://", rank=rank,
                            world_size=world)
    big = torch.full((4 << 20,), rank + 1, dtype=torch.int32)
    if rank == victim:
        for r in range(victim):
            _wait(events, f"entered_{r}")
        work = dist.all_reduce(big, async_op=True)
        total = sum(r + 1 for r in range(world))
        deadline = time.monotonic() + 60.0
        while int(big[0]) != total and not work.is_completed() and time.monotonic() < deadline:
            pass
        midway = int(big[0]) == total and int(big[-1]) == rank + 1 and not work.is_completed()
        with open(_event(events, "victim"), "w") as f:
            f.write("midway" if midway else f"not midway: t[0]={int(big[0])} t[-1]={int(big[-1])}")
        os.kill(os.getpid(), signal.SIGKILL)
    work = dist.all_reduce(big, async_op=True)
    _signal(events, f"entered_{rank}")
    try:
        work.wait()
    except Exception:  # noqa: BLE001 - the failed op is expected to raise
        pass
    else:
        print(f"rank {rank}: the all_reduce the victim died in completed without an error",
              file=sys.stderr)
        sys.exit(4)
    t = torch.full((8,), float(rank + 1))
    dist.all_reduce(t)
    want = float(sum(r + 1 for r in range(victim)))
    if t.tolist() != [want] * 8:
        print(f"rank {rank}: all_reduce among the survivors gave {t.tolist()}, want {want}",
              file=sys.stderr)
        sys.exit(3)
    if mode == "destroy":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
