"""Steps whose EP ops ended at their deadline instead of on their peers' data.

A fast-path op whose wait outlives ``timeout_us`` marks the late source rank 0
in the op's ``active_ranks`` and goes on (the EP contract), so a lost peer or
a stalled GPU ends the op instead of hanging the run. The benchmark passes one
``active_ranks`` tensor to every op; ``TimeoutLog.after_step`` reads it once
the step has synchronized, notes which ranks a timeout took out, and marks
them active again, so that one late step does not leave the later ones
running without those ranks. A step with a timeout measured the deadline, not
the op: the JSON's ``timeouts`` lists such steps per rank (phase, step,
sources), and their latencies are no figures.
"""

import sys

import torch.distributed as dist


class TimeoutLog:
    def __init__(self, rank):
        self.rank = rank
        self.phase, self.step = "warmup", 0
        self.events = []

    def start(self, phase):
        self.phase, self.step = phase, 0

    def after_step(self, active_ranks):
        """After a synchronized step: its timeouts, if any, are noted and undone."""
        marked = [r for r, v in enumerate(active_ranks.cpu().tolist()) if v == 0]
        if marked:
            event = {"phase": self.phase, "step": self.step, "sources": marked}
            if not self.events:
                print(f"rank {self.rank}: an op timed out waiting for ranks {marked} "
                      f"({self.phase} step {self.step}); see the JSON's 'timeouts'",
                      file=sys.stderr, flush=True)
            self.events.append(event)
            active_ranks.fill_(1)
        self.step += 1


def gather(log, group, world_size):
    """Every rank's events, on every rank: {rank (str): [events]} for ranks that had any."""
    everyone = [None] * world_size
    dist.all_gather_object(everyone, log.events, group=group)
    return {str(r): events for r, events in enumerate(everyone) if events}
