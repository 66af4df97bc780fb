"""The GPU's SM clock and power while the timed steps run.

Latency-bound kernels slow down with the SM clock, and the clock a GPU keeps
depends on how busy it is. Sampled from outside over a whole call, an H100
shared by 8 processes read 345 to 840 MHz, but those samples fell in the idle
gaps between runs: sampled only while the timed steps run, as here, it read
its 1,980 MHz maximum with either launch pad (2026-12-06). Every figure this
benchmark prints is read at some clock, so the run records it: `nvidia-smi`
samples the device every `period_ms` from a background process while the
steps run. The benchmark changes no clock setting.
"""

import statistics
import subprocess
import threading

QUERY = "clocks.sm,clocks.max.sm,power.draw"


def nvidia_smi_id(uuid):
    """A GPU UUID (torch's device properties) as `nvidia-smi -i` takes it,
    whatever CUDA_VISIBLE_DEVICES renumbers."""
    return uuid if uuid.startswith("GPU-") else "GPU-" + uuid


def parse_sample(line):
    """One line of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`:
    (sm_mhz, max_sm_mhz, power_w), or None for a line that is not a sample
    (a field reading "[N/A]" makes that value None)."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 3:
        return None

    def number(text):
        try:
            return float(text)
        except ValueError:
            return None

    sm, max_sm, power = (number(f) for f in fields)
    if sm is None:
        return None
    return sm, max_sm, power


def _spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(samples, unavailable=None):
    """The JSON record of a run's samples: SM clock and power spreads, the
    device's maximum SM clock, and the sample count; `unavailable` says why
    there are none."""
    if not samples:
        return {"samples": 0,
                "unavailable": unavailable or "no sample was read while the steps ran"}
    max_sm = [m for _, m, _ in samples if m is not None]
    return {"samples": len(samples),
            "sm_mhz": _spread([s for s, _, _ in samples]),
            "max_sm_mhz": max(max_sm) if max_sm else None,
            "power_w": _spread([p for _, _, p in samples])}


def describe(record):
    """One line for the console."""
    if not record.get("samples"):
        return f"SM clock during the timed steps: not sampled ({record.get('unavailable')})"
    sm, power = record["sm_mhz"], record.get("power_w")
    text = (f"SM clock during the timed steps: median {sm['median']:.0f} MHz (min {sm['min']:.0f}, "
            f"max {sm['max']:.0f}")
    if record.get("max_sm_mhz"):
        text += f"; the device's maximum {record['max_sm_mhz']:.0f}"
    text += f"), {record['samples']} samples"
    if power:
        text += f"; power median {power['median']:.0f} W"
    return text


class ClockSampler:
    """Context manager: samples the clock of GPU `gpu` (an index or
    nvidia_smi_id()) while its body runs. `command` replaces the nvidia-smi
    command line (tests)."""

    def __init__(self, gpu, period_ms=50, command=None):
        self.command = command or ["nvidia-smi", f"--query-gpu={QUERY}",
                                   "--format=csv,noheader,nounits", "-i", str(gpu),
                                   "-lms", str(period_ms)]
        self.samples = []
        self.unavailable = None
        self._proc = None
        self._reader = None
        self._lock = threading.Lock()
        self._taking = False

    def __enter__(self):
        try:
            self._proc = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
        except OSError as e:
            self.unavailable = f"{self.command[0]} could not run: {e}"
            return self
        self._taking = True
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            sample = parse_sample(line)
            with self._lock:
                if not self._taking:
                    break
                if sample:
                    self.samples.append(sample)

    def __exit__(self, *exc):
        if self._proc is None:
            return False
        with self._lock:
            self._taking = False
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)
        if not self.samples:
            self.unavailable = (f"{self.command[0]} printed no sample while the steps ran "
                                f"(exit status {self._proc.returncode})")
        return False

    def record(self):
        with self._lock:
            return summarize(list(self.samples), self.unavailable)
