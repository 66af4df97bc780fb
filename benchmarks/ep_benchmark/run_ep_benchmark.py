#!/usr/bin/env python3
"""Mooncake EP dispatch/combine benchmark: uniform, k_hot incast and zipf routing.

    # one host: spawns --num-ranks workers
    python benchmarks/ep_benchmark/run_ep_benchmark.py --num-ranks 8 --routing-mode k_hot
    # several hosts: torchrun sets RANK/WORLD_SIZE (--num-ranks is ignored)
    torchrun --nproc-per-node 4 ... run_ep_benchmark.py --config configs/cuda_zipfian.json
    # CPU smoke run over the collective fallback (wall-clock timers)
    python benchmarks/ep_benchmark/run_ep_benchmark.py --device cpu --pg-backend gloo \
        --num-ranks 2 --num-experts 8 --hidden-size 256 --num-tokens 16 --iters 5

See README.md in this folder for every flag and the JSON schema.
"""

import argparse
import contextlib
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
for _p in (_HERE, os.path.join(_REPO, "python")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from mooncake._ep_checks import HIDDEN_ALIGN  # noqa: E402

import clocks  # noqa: E402
import metrics  # noqa: E402
import phase_trace  # noqa: E402
import routing  # noqa: E402
import timing  # noqa: E402
import timeouts  # noqa: E402

PG_BACKENDS = ("nccl", "mooncake", "mooncake-cpu", "gloo")
CPU_PG_BACKENDS = ("mooncake-cpu", "gloo")
# --ep-transport: the plain Buffer, or an ElasticBuffer asked for one of its transports.
EP_TRANSPORTS = ("buffer", "auto", "ibgda", "nccl")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="JSON file of defaults; CLI flags override it")
    p.add_argument("--backend", default="cuda", help="label written to the JSON; changes nothing")
    p.add_argument("--num-ranks", type=int, default=8, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--num-experts", type=int, default=256)
    p.add_argument("--hidden-size", type=int, default=7168)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--num-tokens", type=int, default=1024, help="tokens per rank (also the buffer capacity)")
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16", help="dispatch data type")
    p.add_argument("--routing-mode", choices=sorted(routing.ROUTING_MODES), default="uniform")
    p.add_argument("--hot-experts", type=int, default=32, help="k_hot: number of hot experts")
    p.add_argument("--hot-fraction", type=float, default=0.9, help="k_hot: share of hot tokens")
    p.add_argument("--zipf-alpha", type=float, default=1.0, help="zipf: exponent alpha")
    p.add_argument("--zero-copy", action=argparse.BooleanOptionalAction, default=False,
                   help="combine through get_next_combine_buffer (fast path only)")
    p.add_argument("--async-finish", action=argparse.BooleanOptionalAction, default=False,
                   help="event-based completion")
    p.add_argument("--return-recv-hook", action=argparse.BooleanOptionalAction, default=False,
                   help="hook-based completion (excludes --async-finish)")
    p.add_argument("--pg-backend", choices=PG_BACKENDS, default="nccl")
    p.add_argument("--warmup-iters", type=int, default=20)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="routing seed; rank r uses seed + r")
    p.add_argument("--json-output", default=None, help="result file (default: rank 0 prints to stdout)")
    p.add_argument("--master-addr", default="127.0.0.1", help="spawn mode only")
    p.add_argument("--master-port", type=int, default=29500, help="spawn mode only")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where tensors live; cpu needs --pg-backend mooncake-cpu or gloo")
    p.add_argument("--timeout-us", type=int, default=10_000_000,
                   help="EP timeout_us (-1: none): a wait that outlives it ends the op, which the "
                        "JSON's 'timeouts' reports, instead of hanging the run (timeouts.py)")
    p.add_argument("--plot", default=None, metavar="PATH.png",
                   help="latency CDFs and the expert-load histogram")
    p.add_argument("--ep-transport", choices=EP_TRANSPORTS, default="buffer",
                   help="buffer: the plain Buffer (cuda_ipc P2P, IBGDA across hosts, else the "
                        "fallback); auto, ibgda, nccl: an ElasticBuffer asked for that transport "
                        "(nccl: the NCCL device-API kernels, one GPU per rank)")
    p.add_argument("--compare", action="store_true",
                   help="run the fast path and the fallback in one invocation, print the speedup")
    p.add_argument("--align-ranks", action="store_true",
                   help="synchronize and barrier all ranks before dispatch and before combine, so "
                        "each op's latency excludes the other ranks' lateness (e.g. their expert "
                        "forward on a shared GPU); end-to-end then includes the barriers")
    p.add_argument("--launch-pad-us", type=int, default=0,
                   help="CUDA: a GPU wait of at least this many microseconds before each timed "
                        "op, so its kernels are queued before its start event fires and its "
                        "latency is device time (the host's Python and launch time excluded; the "
                        "pad must outlast them, e.g. 1000). With --align-ranks and every rank on "
                        "one GPU it ends at one instant of its clock for all of them (rank 0 "
                        "broadcasts it), so the ranks' host lateness is left out too; otherwise "
                        "at the next multiple of twice N of the GPU clock; 0: eager latency, host "
                        "time included")
    p.add_argument("--pad-busy-blocks", type=int, default=0, metavar="N",
                   help="CUDA, with --launch-pad-us: the pad waits in N blocks of one warp that "
                        "poll the GPU clock instead of one sleeping thread, so the GPU is as busy "
                        "before each op as between the layers of a model (JSON 'sm_clock' records "
                        "the clock either way); 0 (default): one sleeping thread")
    p.add_argument("--phase-trace", type=int, default=0, metavar="K",
                   help="CUDA fast path: K more steps after the timed ones with the kernels' "
                        "per-block timestamps on, reported as each rank's timeline of each op "
                        "(JSON 'phase_trace', a table on stderr; phase_trace.py)")
    return p


def load_config(path, parser):
    with open(path) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f"--config {path}: expected a JSON object, got {type(cfg).__name__}")
    known = {a.dest for a in parser._actions}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown keys {unknown}; expected some of {sorted(known)}")
    return cfg


def parse_args(argv=None):
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)
    parser = build_parser()
    if known.config:
        parser.set_defaults(**load_config(known.config, parser))
    args = parser.parse_args(argv)
    validate_args(args)
    return args


def world_size_of(args):
    return int(os.environ["WORLD_SIZE"]) if "RANK" in os.environ else args.num_ranks


def validate_args(args):
    """ValueError naming the flag, its value and the rule."""
    world = world_size_of(args)
    for name in ("num_ranks", "num_experts", "hidden_size", "top_k", "num_tokens", "iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup_iters < 0:
        raise ValueError(f"--warmup-iters must be >= 0, got {args.warmup_iters}")
    if args.num_experts % world != 0:
        raise ValueError(
            f"--num-experts {args.num_experts} must be divisible by the number of ranks {world}")
    if args.top_k > args.num_experts:
        raise ValueError(f"--top-k {args.top_k} must be <= --num-experts {args.num_experts}")
    if args.async_finish and args.return_recv_hook:
        raise ValueError("--async-finish and --return-recv-hook are mutually exclusive")
    if args.dtype == "fp8" and args.hidden_size % HIDDEN_ALIGN != 0:
        raise ValueError(
            f"--dtype fp8 needs --hidden-size divisible by {HIDDEN_ALIGN} (one scale per "
            f"{HIDDEN_ALIGN} channels), got {args.hidden_size}")
    if args.hidden_size % HIDDEN_ALIGN != 0:
        raise ValueError(f"--hidden-size must be a multiple of {HIDDEN_ALIGN} (Buffer.dispatch), "
                         f"got {args.hidden_size}")
    if args.routing_mode == "k_hot":
        routing.check_k_hot(args.num_experts, args.top_k, args.hot_experts, args.hot_fraction)
    if args.routing_mode == "zipf":
        routing.check_zipf(args.zipf_alpha)
    if args.device == "cpu" and args.pg_backend not in CPU_PG_BACKENDS:
        raise ValueError(
            f"--device cpu needs --pg-backend in {CPU_PG_BACKENDS}, got {args.pg_backend}")
    if args.launch_pad_us < 0:
        raise ValueError(f"--launch-pad-us must be >= 0, got {args.launch_pad_us}")
    if args.launch_pad_us and args.device != "cuda":
        raise ValueError(f"--launch-pad-us {args.launch_pad_us} needs --device cuda (the CPU "
                         f"fallback is timed by wall clock, with nothing queued to pad)")
    if not 0 <= args.pad_busy_blocks <= timing.MAX_PAD_BUSY_BLOCKS:
        raise ValueError(f"--pad-busy-blocks must be 0 to {timing.MAX_PAD_BUSY_BLOCKS}, got "
                         f"{args.pad_busy_blocks}")
    if args.pad_busy_blocks and not args.launch_pad_us:
        raise ValueError(f"--pad-busy-blocks {args.pad_busy_blocks} needs --launch-pad-us > 0 "
                         f"(it shapes the pad)")
    if args.phase_trace < 0:
        raise ValueError(f"--phase-trace must be >= 0, got {args.phase_trace}")
    if args.phase_trace and args.device != "cuda":
        raise ValueError(f"--phase-trace {args.phase_trace} needs --device cuda (it reads the "
                         f"fast path's kernels' timestamps)")
    if args.timeout_us != -1 and args.timeout_us <= 0:
        raise ValueError(f"--timeout-us must be -1 or > 0, got {args.timeout_us}")


def make_buffer(args, group, world_size, buffer_cls):
    """The EP buffer under test: a Buffer, or an ElasticBuffer asked for --ep-transport."""
    if args.ep_transport == "buffer":
        size = buffer_cls.get_ep_buffer_size_hint(args.num_tokens, args.hidden_size, world_size,
                                                  args.num_experts)
        return buffer_cls(group, size)
    from mooncake.mooncake_elastic_buffer import ElasticBuffer
    return ElasticBuffer(group, args.num_tokens, args.hidden_size, args.top_k,
                         transport=args.ep_transport, num_experts=args.num_experts)


def describe_buffer(buffer):
    """What the JSON says about the buffer: its class and, for an ElasticBuffer, the
    transport it resolved to and why."""
    out = {"ep_buffer": type(buffer).__name__}
    if hasattr(buffer, "transport"):
        out["ep_transport"] = buffer.transport
        out["ep_transport_reason"] = buffer.transport_reason
    return out


def check_environment(args, local_world_size):
    """RuntimeError, before any process group exists, for setups that cannot run."""
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "--device cuda but torch.cuda.is_available() is False; use --device cpu with "
                "--pg-backend mooncake-cpu or gloo")
        gpus = torch.cuda.device_count()
        if args.pg_backend == "nccl" and local_world_size > gpus:
            raise RuntimeError(
                f"--pg-backend nccl needs one GPU per rank: {local_world_size} ranks on this host "
                f"but {gpus} visible GPU(s) (NCCL refuses two ranks on one GPU); use "
                f"--pg-backend mooncake or fewer ranks")
    if args.pg_backend.startswith("mooncake"):
        try:
            from mooncake import pg  # noqa: F401  (registers the backends)
        except ImportError as e:
            raise RuntimeError(f"--pg-backend {args.pg_backend} needs mooncake.pg: {e}") from e


class EPBenchmarkWorker:
    def __init__(self, args, rank, world_size, device, buffer_cls, group):
        self.args, self.rank, self.world = args, rank, world_size
        self.device, self.group = device, group
        self.clock = timing.Clock(device, args.pad_busy_blocks)
        self.last_pads = {}  # op -> the GPU clock instant its pad ended at (pad_together)
        # Ranks sharing one GPU start each timed op at one instant of its clock.
        self.pads_together = bool(args.align_ranks and args.launch_pad_us
                                  and self.clock.can_pad_together(device, group))
        self.num_local = args.num_experts // world_size
        self.buffer = make_buffer(args, group, world_size, buffer_cls)
        self.zero_copy = args.zero_copy
        self.topk_idx, self.topk_weights = routing.generate_routing(
            args.routing_mode, args.num_tokens, args.num_experts, args.top_k, args.seed + rank,
            device=device, hot_experts=args.hot_experts, hot_fraction=args.hot_fraction,
            zipf_alpha=args.zipf_alpha)
        gen = torch.Generator().manual_seed(10_000 + args.seed + rank)
        self.x = torch.randn(args.num_tokens, args.hidden_size, generator=gen).to(
            torch.bfloat16).to(device)
        self.active_ranks = torch.ones(world_size, dtype=torch.int32, device=device)
        self.timeouts = timeouts.TimeoutLog(rank)
        self.out = torch.zeros(args.num_tokens, args.hidden_size, dtype=torch.bfloat16, device=device)
        ids = torch.arange(rank * self.num_local, (rank + 1) * self.num_local, device=device)
        self.expert_scale = (ids * 0.1 + 1.0).to(torch.bfloat16).view(-1, 1, 1)

    def mock_expert_forward(self, recv_x):
        if isinstance(recv_x, tuple):
            from mooncake.mooncake_ep_buffer import fp8_dequantize
            recv_x = fp8_dequantize(*recv_x)
        return recv_x * self.expert_scale

    def _complete(self, event, hook):
        if self.args.return_recv_hook:
            hook()
        # Also without --async-finish: the in-stream wait keeps iterations from overlapping.
        event.current_stream_wait()

    def _align(self):
        if self.args.align_ranks:
            self.clock.sync()
            dist.barrier(group=self.group)

    def _pad(self, op):
        """Pads before `op`; keeps the shared instant it ends at (GPU clock ns)
        in last_pads[op], None without one."""
        target = None
        if self.pads_together:
            target = self.clock.pad_together(self.args.launch_pad_us, self.group, self.rank)
        else:
            self.clock.pad(self.args.launch_pad_us)
        self.last_pads[op] = target

    def step(self):
        a = self.args
        self._align()
        self._pad("dispatch")
        t0 = self.clock.stamp()
        recv_x, _, handle, event, hook = self.buffer.dispatch(
            self.x, self.topk_idx, self.active_ranks, a.num_tokens, a.num_experts, a.timeout_us,
            use_fp8=a.dtype == "fp8", async_finish=a.async_finish,
            return_recv_hook=a.return_recv_hook)
        d_sent = self.clock.stamp() if a.return_recv_hook else None
        self._complete(event, hook)
        t1 = self.clock.stamp()
        expert_out = self.mock_expert_forward(recv_x)
        if self.zero_copy:
            combine_in = self.buffer.get_next_combine_buffer(handle)
            combine_in.copy_(expert_out)
        else:
            combine_in = expert_out.contiguous()
        self._align()
        self._pad("combine")
        t2 = self.clock.stamp()
        _, event, hook = self.buffer.combine(
            combine_in, self.topk_idx, self.topk_weights, self.active_ranks, a.timeout_us, handle,
            zero_copy=self.zero_copy, async_finish=a.async_finish,
            return_recv_hook=a.return_recv_hook, out=self.out)
        c_sent = self.clock.stamp() if a.return_recv_hook else None
        self._complete(event, hook)
        t3 = self.clock.stamp()
        self.clock.sync()
        self.timeouts.after_step(self.active_ranks)
        e = self.clock.elapsed_ms
        times = (e(t0, t1), e(t2, t3), e(t0, t3))
        if a.return_recv_hook:
            # Where the time goes: the send half (up to the hook) of each op.
            times += (e(t0, d_sent), e(t2, c_sent))
        return times

    def warmup(self):
        self.timeouts.start("warmup")
        for _ in range(self.args.warmup_iters):
            self.step()
        self.clock.sync()

    def run_measured(self):
        self.timeouts.start("measured")
        samples = [self.step() for _ in range(self.args.iters)]
        return [torch.tensor([s[i] for s in samples], dtype=torch.float64)
                for i in range(len(samples[0]))]

    def gathered(self, local):
        return [metrics.gather_latencies(t, self.group) for t in local]


def _make_group(args, rank, world_size, local_rank):
    check_environment(args, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    if args.device == "cuda":
        # Several ranks may share one GPU (MPS): rank r uses GPU r mod count.
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=args.pg_backend, init_method="env://", rank=rank,
                            world_size=world_size)
    return device


def _summary(doc):
    m = doc["metrics"]
    out = {k: m[k] for k in ("dispatch_latency_ms", "combine_latency_ms",
                             "end_to_end_latency_ms", "tokens_per_second")}
    if "bandwidth" in doc:
        out["bandwidth"] = doc["bandwidth"]
    return out


def measure_copy_rate(device, group, rank, nbytes=1 << 30, reps=10):
    """Bytes copied per second by a large device-to-device copy on rank 0.

    A byte copied is read and written once, as a payload byte moved between
    two ranks sharing the GPU is; the HBM traffic is twice this. The other
    ranks wait at a barrier meanwhile, so the copy has the GPU (and its HBM,
    which every rank on it shares) to itself. None on CPU.
    """
    rate = None
    dist.barrier(group=group)
    if device.type == "cuda" and rank == 0:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000.0)
        rate = nbytes / sorted(times)[len(times) // 2]
        del src, dst
        torch.cuda.empty_cache()
    dist.barrier(group=group)
    return rate


def global_copies(topk_idx, group):
    """Token copies of one dispatch over all ranks (entries != -1)."""
    n = torch.tensor([int((topk_idx >= 0).sum())], dtype=torch.int64)
    n = n.to(metrics._collective_device(group))
    dist.all_reduce(n, group=group)
    return int(n.cpu())


def run_worker(args, rank, world_size, local_rank):
    from mooncake.mooncake_ep_buffer import FORCE_FALLBACK_ENV, Buffer

    if os.environ.get("EP_BENCH_STACKS_AFTER_S"):
        import faulthandler  # a stuck run shows where each rank is
        faulthandler.dump_traceback_later(float(os.environ["EP_BENCH_STACKS_AFTER_S"]))
    device = _make_group(args, rank, world_size, local_rank)
    group = dist.group.WORLD
    try:
        worker = EPBenchmarkWorker(args, rank, world_size, device, Buffer, group)
        phases = [("fast_path" if worker.buffer.use_fast_path else "fallback", worker)]
        notice = None
        if args.compare:
            if worker.buffer.use_fast_path:
                os.environ[FORCE_FALLBACK_ENV] = "1"
                try:
                    slow = EPBenchmarkWorker(args, rank, world_size, device, Buffer, group)
                finally:
                    os.environ.pop(FORCE_FALLBACK_ENV, None)
                slow.zero_copy = False  # get_next_combine_buffer is fast-path only
                phases.append(("fallback", slow))
            else:
                notice = (f"--compare: the fast path is unavailable "
                          f"({worker.buffer.fast_path_reason}); ran the fallback only")
        if worker.zero_copy and not worker.buffer.use_fast_path:
            raise RuntimeError(
                f"--zero-copy needs the fast path (get_next_combine_buffer), but this run uses the "
                f"fallback: {worker.buffer.fast_path_reason}; rerun with --no-zero-copy")
        copy_rate = measure_copy_rate(device, group, rank)
        copies = global_copies(worker.topk_idx, group)
        docs = {}
        for name, w in phases:
            w.warmup()
            # Rank 0 records the SM clock the steps ran at (ranks on other GPUs
            # are not sampled).
            sampler = (clocks.ClockSampler(clocks.nvidia_smi_id(timing.gpu_uuid(device)))
                       if rank == 0 and device.type == "cuda" else None)
            with sampler or contextlib.nullcontext():
                local = w.run_measured()
            per_rank = w.gathered(local)
            load, counts = metrics.compute_global_expert_load(w.topk_idx, args.num_experts, group)
            extra = {
                "device": args.device,
                "ep_path": name,
                **describe_buffer(w.buffer),
                "fast_path_unavailable_reason": None if w.buffer.use_fast_path else w.buffer.fast_path_reason,
                "timer": ("wall_clock" if device.type != "cuda" else
                          f"cuda_events_after_{args.launch_pad_us}us_launch_pad"
                          + ("_to_a_shared_instant" if w.pads_together else "")
                          + (f"_of_{args.pad_busy_blocks}_busy_blocks"
                             if args.pad_busy_blocks else "")
                          if args.launch_pad_us else "cuda_events"),
            }
            d_bytes, c_bytes = metrics.payload_bytes(copies, args.hidden_size, args.dtype == "fp8")
            d_ms = metrics.latency_stats(metrics.critical_path(per_rank[0]))["p50"]
            c_ms = metrics.latency_stats(metrics.critical_path(per_rank[1]))["p50"]
            extra["bandwidth"] = metrics.bandwidth_summary(d_bytes, c_bytes, d_ms, c_ms, copy_rate,
                                                           world_size)
            if sampler:
                extra["sm_clock"] = sampler.record()
            if len(per_rank) == 5:
                # Each op's send half (launch pad to hook, slowest rank); the
                # rest of its latency is the receive half.
                extra["send_half_latency_ms"] = {
                    op: metrics.latency_stats(metrics.critical_path(t))
                    for op, t in (("dispatch", per_rank[3]), ("combine", per_rank[4]))}
            if args.phase_trace:
                w.timeouts.start("trace")
                extra["phase_trace"] = phase_trace.gather_report(
                    w, args.phase_trace, group, world_size, timing.gpu_uuid(w.device))
            extra["timeouts"] = timeouts.gather(w.timeouts, group, world_size)
            docs[name] = (metrics.assemble_json_output(args, world_size, *per_rank[:3], load, extra),
                          per_rank, counts)
        if rank == 0:
            _emit(args, docs, phases, notice)
    finally:
        dist.destroy_process_group()


def _emit(args, docs, phases, notice):
    first = phases[0][0]
    doc, per_rank, counts = docs[first]
    if args.compare:
        fast = docs.get("fast_path")
        slow = docs.get("fallback")
        speedup, speedups = None, {}
        if fast and slow:
            speedup = (slow[0]["metrics"]["end_to_end_latency_ms"]["mean"]
                       / fast[0]["metrics"]["end_to_end_latency_ms"]["mean"])
            for key in ("dispatch_latency_ms", "combine_latency_ms"):
                speedups[key.replace("_latency_ms", "_median")] = (
                    slow[0]["metrics"][key]["p50"] / fast[0]["metrics"][key]["p50"])
        doc["compare"] = {
            "fast_path": _summary(fast[0]) if fast else None,
            "fallback": _summary(slow[0]) if slow else None,
            "speedup_end_to_end_mean": speedup,
            "speedup": speedups,
            "note": notice,
        }
        if not notice:
            # The end-to-end step also holds the mock experts (and, aligned, the pads).
            notice = (f"--compare: the fast path's median is {speedups['dispatch_median']:.1f}x "
                      f"the fallback's for dispatch, {speedups['combine_median']:.1f}x for "
                      f"combine ({speedup:.2f}x mean end-to-end, mock experts included)")
        print(notice, file=sys.stderr)
    if doc.get("sm_clock"):
        print(clocks.describe(doc["sm_clock"]), file=sys.stderr)
    text = json.dumps(doc, indent=2)
    if args.json_output:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_output)), exist_ok=True)
        with open(args.json_output, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.plot:
        from plots import plot_results
        crit = [metrics.critical_path(t) for t in per_rank[:3]]
        plot_results(args.plot, *crit, counts,
                     f"{args.routing_mode}, {doc['world_size']} ranks, {args.dtype}, {first}")


def _spawn_entry(local_rank, args):
    os.environ["RANK"] = str(local_rank)
    os.environ["LOCAL_RANK"] = str(local_rank)
    os.environ["WORLD_SIZE"] = str(args.num_ranks)
    os.environ["LOCAL_WORLD_SIZE"] = str(args.num_ranks)
    run_worker(args, local_rank, args.num_ranks, local_rank)


def main(argv=None):
    args = parse_args(argv)
    if "RANK" in os.environ:  # torchrun
        run_worker(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                   int(os.environ.get("LOCAL_RANK", 0)))
        return
    check_environment(args, args.num_ranks)
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    import torch.multiprocessing as mp
    mp.spawn(_spawn_entry, args=(args,), nprocs=args.num_ranks, join=True)


if __name__ == "__main__":
    main()
