"""ep_benchmark's timers and launch pads: CUDA events on the GPU, the wall
clock on the CPU, and the GPU waits queued before each timed op so that its
latency is device time (--launch-pad-us, --align-ranks, --pad-busy-blocks)."""

import time

import torch
import torch.distributed as dist

import metrics

# The EP extension's bound on a busy pad's blocks (kernels/aligned_pad.h,
# kMaxPadBusyBlocks), checked by the CLI before any rank starts.
MAX_PAD_BUSY_BLOCKS = 65535


def gpu_uuid(device):
    """The GPU's UUID: ranks that report the same one share its clock."""
    return str(torch.cuda.get_device_properties(device).uuid)


class Clock:
    """CUDA events on the GPU, wall clock on the CPU (where the fallback is synchronous)."""

    def __init__(self, device, busy_blocks=0):
        self.cuda = device.type == "cuda"
        self.busy_blocks = busy_blocks  # the pads' (--pad-busy-blocks)
        self._cycles_per_us = None
        self._aligned_pad = None  # the EP extension's aligned_pad, False without it

    def stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed_ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1000.0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _runtime(self):
        from mooncake import _ep_runtime
        return _ep_runtime.runtime()

    def can_pad_together(self, device, group):
        """Whether every rank of `group` is on this one GPU (one clock) with the
        EP extension's pad_until: agreed by all ranks, so that they all take
        pad_together() or none does (its broadcast would otherwise wait)."""
        runtime = self._runtime() if self.cuda else None
        mine = (gpu_uuid(device) if self.cuda else "",
                runtime is not None and hasattr(runtime, "pad_until"))
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
        return self.cuda and all(ok for _, ok in everyone) and len({u for u, _ in everyone}) == 1

    def pad_together(self, us, group, rank):
        """Queues a GPU wait that ends at one instant for every rank of `group`
        (all on this GPU: can_pad_together): rank 0 reads the GPU's clock and
        adds `us`, every rank waits until the clock reaches that target, at
        most 4 * us. (The period of pad() can put a rank that queued its pad
        just past a period's boundary one period behind the others: steps of
        2 * us more were seen, 1 in 10 to 100.) A rank that queues its wait
        after the target starts late, and its latency shows it."""
        if us <= 0:
            return None
        runtime = self._runtime()
        target = torch.zeros(1, dtype=torch.int64, device=metrics._collective_device(group))
        if rank == 0:
            target.fill_(runtime.gpu_clock_ns() + int(us * 1000))
        dist.broadcast(target, 0, group=group)
        runtime.pad_until(int(target.item()), int(4 * us * 1000), self.busy_blocks)
        return int(target.item())

    def pad(self, us):
        """Queues a GPU wait of at least `us` microseconds (nothing on the CPU).

        With the EP extension, the wait ends at the next multiple of 2 * us of
        the GPU's clock, which ranks sharing the GPU share: their timed ops
        then start together, and a rank's latency leaves out the others' host
        lateness (each queued its pad within the same period after the
        barrier). Without it, a torch.cuda._sleep of about `us`."""
        if not self.cuda or us <= 0:
            return
        if self._aligned_pad is None:
            runtime = self._runtime()
            self._aligned_pad = runtime.aligned_pad if runtime is not None else False
        if self._aligned_pad:
            self._aligned_pad(float(us), float(2 * us), self.busy_blocks)
            return
        if self.busy_blocks:
            raise RuntimeError("--pad-busy-blocks needs the EP extension's pads (the extension "
                               "is not built here)")
        if self._cycles_per_us is None:  # torch.cuda._sleep counts clock cycles
            probe = 1_000_000
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(probe)
            b.record()
            b.synchronize()
            self._cycles_per_us = probe / max(a.elapsed_time(b) * 1000.0, 1e-3)
        torch.cuda._sleep(int(us * self._cycles_per_us))
