"""Where an EP op's time goes, from the kernels' per-block timestamps.

With ``--phase-trace K`` the fast path's kernels record, for K more steps after
the timed ones, when each block started, reached its middle mark and ended
(mooncake-ep/core/phase_trace.h: one GPU clock for every process of the GPU;
it may advance in steps of about 1 us, so shorter phases read as 0). Each rank
reduces its trace to a few instants per kernel (``summarize``); rank 0 puts
every rank's on one timeline per op, in microseconds from the op's earliest
send block when all ranks share one GPU, else each rank's from its own
(``report``):

    send_start, send_end        the rank's send kernel: first block start, last end
    send_written                the last send block done writing data (then signals)
    receive_start               its receive kernel's first block start
    first_wait_min, _max        receive blocks' first wait done (counts or flags of
                                their first expert or token), earliest and latest
    receive_end                 the last receive block's end: the op is done there
    pad                         the instant the launch pads ended (--align-ranks with
                                --launch-pad-us: every rank's op was queued behind it)
    send_block, receive_block   a block's own time (end - start), median over the
                                kernel's blocks: what one block costs, where the
                                instants above include blocks waiting for an SM
    send_block_middle,          the same up to the block's middle mark: a send
    receive_block_middle        block's writing, a receive block's first wait
    event_end                   the rank's completion event (the benchmark's latency
                                after the pad): what the op costs past its receive

The receive kernel starts after the send kernel on the rank's stream, so
``receive_start - send_end`` is the gap between them, and ``first_wait_max -
receive_start`` how long a receive block waited for its peers.
"""

import statistics
import sys

import torch
import torch.distributed as dist

OPS = {"dispatch": ("dispatch_send", "dispatch_receive"),
       "combine": ("combine_send", "combine_receive")}
FIELDS = ("pad", "send_start", "send_written", "send_end", "receive_start", "first_wait_min",
          "first_wait_max", "receive_end", "event_end", "send_block", "send_block_middle",
          "receive_block", "receive_block_middle")


def summarize(trace, layout, ops=None):
    """One rank's trace of one step (int64 [layout['slots']], ns; 0 = no mark)
    -> {kernel: {"start", "middle_min", "middle_max", "end", "block", "block_middle",
    "truncated"}}, the instants in ns (None where no block wrote that mark),
    "block" and "block_middle" the lower medians of the blocks' end - start
    and middle - start (ns, None without one); "truncated": the
    grid may have had blocks past max_blocks, which record nothing. `ops`:
    {op: {"pad_ns", "latency_us"}} where known (the GPU clock instant the op's
    launch pad ended, and the op's event latency after it), kept under "ops"."""
    marks = trace.reshape(len(layout["kernels"]), layout["max_blocks"], len(layout["marks"]))
    start, middle, end = (layout["marks"].index(m) for m in ("start", "middle", "end"))
    out = {}
    for k, name in enumerate(layout["kernels"]):
        def pick(mark, reduce):
            v = marks[k, :, mark]
            v = v[v != 0]
            return int(reduce(v)) if v.numel() else None
        def span(mark):
            both = (marks[k, :, start] != 0) & (marks[k, :, mark] != 0)
            spans = (marks[k, :, mark] - marks[k, :, start])[both]
            return int(spans.median()) if spans.numel() else None
        out[name] = {"start": pick(start, torch.min), "middle_min": pick(middle, torch.min),
                     "middle_max": pick(middle, torch.max), "end": pick(end, torch.max),
                     "block": span(end), "block_middle": span(middle),
                     "truncated": bool(marks[k, -1, start] != 0)}
    out["ops"] = dict(ops or {})
    return out


def _op_timeline(ranks, op, send, receive, shared_clock):
    """Every rank's instants of one op of one step, in us from the earliest
    send block (of all ranks with a shared clock, else of each rank's own)."""
    starts = [r[send]["start"] for r in ranks if r[send]["start"] is not None]
    if not starts:
        return None
    out = []
    for r in ranks:
        t0 = min(starts) if shared_clock else r[send]["start"]

        def us(v):
            return None if v is None or t0 is None else (v - t0) / 1000.0
        extra = r.get("ops", {}).get(op, {})
        pad_ns, latency_us = extra.get("pad_ns"), extra.get("latency_us")
        event_ns = None if pad_ns is None or latency_us is None else pad_ns + latency_us * 1000.0
        def span(v):
            return None if v is None else v / 1000.0
        out.append({"pad": us(pad_ns), "event_end": us(event_ns),
                    "send_block": span(r[send].get("block")),
                    "send_block_middle": span(r[send].get("block_middle")),
                    "receive_block": span(r[receive].get("block")),
                    "receive_block_middle": span(r[receive].get("block_middle")), "send_start": us(r[send]["start"]), "send_written": us(r[send]["middle_max"]),
                    "send_end": us(r[send]["end"]), "receive_start": us(r[receive]["start"]),
                    "first_wait_min": us(r[receive]["middle_min"]),
                    "first_wait_max": us(r[receive]["middle_max"]),
                    "receive_end": us(r[receive]["end"])})
    return out


def _latest(timeline):
    """The rank whose receive ended last (None if no rank's did)."""
    ends = [(t["receive_end"], r) for r, t in enumerate(timeline) if t["receive_end"] is not None]
    return max(ends)[1] if ends else None


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def report(per_rank_steps, shared_clock=True):
    """per_rank_steps[rank][step] = summarize(...) -> {op: {"per_rank": [{field:
    median over steps}], "slowest": {field: median over steps of the fields of
    the rank whose receive ended last}, "per_step": [{"slowest_rank",
    "receive_end"} of each step]}}. `shared_clock`: every rank ran on one GPU,
    so one timeline serves them all."""
    steps = min(len(s) for s in per_rank_steps)
    out = {"steps": steps,
           "unit": ("us after the op's earliest send block start" if shared_clock else
                    "us after the rank's own earliest send block start (ranks on several GPUs, "
                    "whose clocks differ)"),
           "truncated": sorted({k for r in per_rank_steps for s in r[:steps] for k, v in s.items()
                                if k != "ops" and v["truncated"]})}
    for op, (send, receive) in OPS.items():
        timelines = [_op_timeline([r[i] for r in per_rank_steps], op, send, receive, shared_clock)
                     for i in range(steps)]
        timelines = [t for t in timelines if t is not None]
        if not timelines:
            out[op] = None
            continue
        ranks = len(per_rank_steps)
        per_rank = [{f: _median([t[r][f] for t in timelines]) for f in FIELDS}
                    for r in range(ranks)]
        latest = [(t, _latest(t)) for t in timelines]
        slowest = {f: _median([t[r][f] for t, r in latest if r is not None]) for f in FIELDS}
        # Medians hide a step that stalled: each step's end is kept as well.
        per_step = [{"slowest_rank": r, "receive_end": None if r is None else t[r]["receive_end"]}
                    for t, r in latest]
        out[op] = {"per_rank": per_rank, "slowest": slowest, "per_step": per_step}
    return out


def format_table(doc):
    """The report as text: one line per op and rank."""
    lines = [f"phase trace, median of {doc['steps']} steps, {doc['unit']}:",
             "op        rank " + " ".join(f"{f:>14}" for f in FIELDS)]
    for op in OPS:
        if not doc.get(op):
            continue
        rows = list(enumerate(doc[op]["per_rank"])) + [("max", doc[op]["slowest"])]
        for r, row in rows:
            cells = " ".join(f"{'-' if row[f] is None else row[f]:>14}" for f in FIELDS)
            lines.append(f"{op:<9} {r:>4} {cells}")
    return "\n".join(lines)


def _fast_buffer(buffer):
    """The fast path's kernels' owner behind a Buffer or an ElasticBuffer, or
    (None, reason)."""
    inner = getattr(buffer, "_inner", None)  # an ElasticBuffer's generation
    plain = inner if inner is not None else buffer
    if not getattr(plain, "use_fast_path", False):
        return None, "the phase trace needs the fast path's kernels (this run takes the fallback)"
    fast = getattr(plain, "_fast", None)
    if fast is None or not hasattr(fast, "set_phase_trace"):
        return None, "this buffer's fast path has no phase trace (the NCCL transport's kernels)"
    if getattr(plain, "ibgda_peers", None):
        return None, "the IBGDA send kernels are not traced"
    return fast, None


def trace_steps(worker, steps, runtime):
    """Runs `steps` more of worker.step() with the kernels' trace on; returns
    (this rank's summaries, None), or (None, reason) where it cannot trace.
    Never raises: every rank goes on to the gather of the results."""
    fast, reason = _fast_buffer(worker.buffer)
    if fast is None:
        return None, reason
    if runtime is None or not hasattr(runtime, "phase_trace_layout"):
        return None, "this build of the EP extension has no phase trace"
    summaries = []
    try:
        layout = runtime.phase_trace_layout()
        trace = torch.zeros(layout["slots"], dtype=torch.int64, device=worker.device)
        fast.set_phase_trace(trace)
        try:
            for _ in range(steps):
                trace.zero_()
                times = worker.step()  # ends with a device sync
                pads = getattr(worker, "last_pads", {})
                ops = {op: {"pad_ns": pads.get(op), "latency_us": times[i] * 1000.0}
                       for i, op in enumerate(OPS)}
                summaries.append(summarize(trace.cpu(), layout, ops))
        finally:
            fast.set_phase_trace(None)
    except Exception as e:  # noqa: BLE001 - reported, and the other ranks are not left waiting
        return None, f"tracing failed on this rank: {type(e).__name__}: {e}"
    return summaries, None


def gather_report(worker, steps, group, world_size, gpu):
    """--phase-trace: every rank traces `steps` steps and sends rank 0 its
    summaries with `gpu` (its GPU's id: ranks on one GPU share a clock); rank
    0's report, also printed on stderr (None on other ranks)."""
    mine, reason = trace_steps(worker, steps, worker.clock._runtime())
    everyone = [None] * world_size
    dist.all_gather_object(everyone, (mine, reason, gpu), group=group)
    if worker.rank != 0:
        return None
    reasons = sorted({r for _, r, _ in everyone if r})
    if reasons:
        return {"unavailable": "; ".join(reasons)}
    doc = report([s for s, _, _ in everyone], shared_clock=len({g for _, _, g in everyone}) == 1)
    print(format_table(doc), file=sys.stderr)
    return doc
