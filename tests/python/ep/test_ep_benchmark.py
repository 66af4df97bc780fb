"""ep_benchmark: routing distributions, metrics by hand, every validation error, CPU smoke runs."""

import json
import math
import os
import subprocess
import sys
import time
import types

import pytest
import torch

import harness

BENCH = os.path.join(harness.REPO_ROOT, "benchmarks", "ep_benchmark")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import clocks  # noqa: E402
import metrics  # noqa: E402
import phase_trace  # noqa: E402
import routing  # noqa: E402
import run_ep_benchmark as bench  # noqa: E402
import timeouts  # noqa: E402


def _no_duplicates(idx):
    s = torch.sort(idx, dim=1).values
    return bool((s[:, 1:] != s[:, :-1]).all())


@pytest.mark.parametrize("mode", sorted(routing.ROUTING_MODES))
def test_routing_shapes_weights_and_distinct_experts(mode):
    idx, w = routing.generate_routing(mode, 500, 64, 8, seed=1, hot_experts=16)
    assert idx.dtype == torch.int64 and idx.shape == (500, 8)
    assert bool(((idx >= 0) & (idx < 64)).all()) and _no_duplicates(idx)
    assert w.dtype == torch.float32 and torch.allclose(w.sum(1), torch.ones(500))
    again, _ = routing.generate_routing(mode, 500, 64, 8, seed=1, hot_experts=16)
    other, _ = routing.generate_routing(mode, 500, 64, 8, seed=2, hot_experts=16)
    assert torch.equal(idx, again) and not torch.equal(idx, other)


def test_k_hot_sends_the_hot_fraction_to_the_hot_experts():
    idx, _ = routing.k_hot_routing(2000, 64, 4, torch.Generator().manual_seed(0),
                                   hot_experts=16, hot_fraction=0.9)
    all_hot = (idx < 16).all(dim=1).float().mean().item()
    # 1800 tokens are hot by construction; a uniform token lands all-hot with p ~ 0.003.
    assert 0.9 <= all_hot <= 0.905, all_hot
    # Shuffled: the hot tokens are not one block at the front.
    assert (idx[1800:] < 16).all(dim=1).float().mean().item() > 0.5


def test_zipf_rank_frequency_slope_is_minus_alpha():
    alpha = 1.2
    idx, _ = routing.zipfian_routing(40000, 64, 1, torch.Generator().manual_seed(0),
                                     zipf_alpha=alpha)
    freq = torch.bincount(idx.flatten(), minlength=64).double()[:16]
    x = torch.log(torch.arange(1, 17, dtype=torch.float64))
    y = torch.log(freq)
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    assert abs(slope + alpha) < 0.1, slope


def test_uniform_is_balanced():
    idx, _ = routing.uniform_routing(20000, 64, 4, torch.Generator().manual_seed(0))
    counts = torch.bincount(idx.flatten(), minlength=64).double()
    assert float(counts.max() / counts.mean()) < 1.2 and float(counts.min() / counts.mean()) > 0.8


def test_latency_stats_by_hand():
    s = metrics.latency_stats([float(v) for v in range(10, 0, -1)])  # 1..10, any order
    want = {"p50": 5.5, "p90": 9.1, "p99": 9.91, "p999": 9.991, "mean": 5.5}
    assert s.keys() == want.keys()
    assert all(math.isclose(s[k], want[k], abs_tol=1e-12) for k in want), s


def test_critical_path_load_and_throughput_by_hand():
    assert metrics.critical_path([[1.0, 5.0], [3.0, 2.0]]).tolist() == [3.0, 5.0]
    assert metrics.expert_load_summary([2, 4, 6, 8]) == {
        "max_tokens_per_expert": 8.0, "min_tokens_per_expert": 2.0,
        "mean_tokens_per_expert": 5.0, "imbalance_ratio": 1.6}
    assert metrics.tokens_per_second(1024, 8, 2.0) == 4_096_000.0
    idx = torch.tensor([[0, 3], [3, -1]])
    assert metrics.local_expert_counts(idx, 4).tolist() == [1.0, 0.0, 0.0, 2.0]


def _args(**kw):
    base = dict(num_experts=8, hidden_size=256, routing_mode="uniform", backend="cuda", top_k=2,
                num_tokens=4, dtype="bf16", zero_copy=False, async_finish=False,
                return_recv_hook=False, warmup_iters=1, iters=2, pg_backend="gloo",
                hot_experts=4, hot_fraction=0.5, zipf_alpha=1.0)
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize("mode", ["uniform", "k_hot", "zipf"])
def test_assembled_json_follows_the_schema(mode):
    d = [[1.0, 2.0], [3.0, 1.0]]
    doc = metrics.assemble_json_output(_args(routing_mode=mode), 2, d, d, [[2.0, 2.0], [2.0, 6.0]],
                                       metrics.expert_load_summary([1, 3]))
    assert metrics.schema_errors(doc, 2) == []
    # e2e critical path [2, 6]: mean 4 ms -> 4 tokens x 2 ranks / 0.004 s
    assert doc["metrics"]["tokens_per_second"] == 2000.0
    assert doc["metrics"]["per_rank_stats"]["e2e_latency_ms"]["rank1"]["mean"] == 4.0
    assert ("hot_experts" in doc) == (mode == "k_hot") and ("zipf_alpha" in doc) == (mode == "zipf")
    del doc["metrics"]["per_rank_stats"]["combine_latency_ms"]["rank1"]
    assert metrics.schema_errors(doc, 2) == ["metrics.per_rank_stats.combine_latency_ms has keys ['rank0']"]


@pytest.fixture
def no_torchrun(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)


SMALL = ["--num-ranks", "2", "--num-experts", "8", "--hidden-size", "256", "--top-k", "2"]


@pytest.mark.parametrize("extra,pattern", [
    (["--num-experts", "9"], r"--num-experts 9 must be divisible by the number of ranks 2"),
    (["--async-finish", "--return-recv-hook"], r"mutually exclusive"),
    (["--dtype", "fp8", "--hidden-size", "200"], r"--dtype fp8 needs --hidden-size divisible by 128 .*got 200"),
    (["--routing-mode", "k_hot", "--hot-experts", "9"], r"hot_experts=9 must be <= num_experts=8"),
    (["--routing-mode", "k_hot", "--hot-experts", "1"], r"hot_experts=1 must be >= top_k=2"),
    (["--routing-mode", "k_hot", "--hot-experts", "4", "--hot-fraction", "1.0"],
     r"hot_fraction must be in the open interval \(0, 1\), got 1.0"),
    (["--routing-mode", "k_hot", "--hot-experts", "4", "--hot-fraction", "0"], r"got 0.0"),
    (["--routing-mode", "zipf", "--zipf-alpha", "0"], r"zipf_alpha must be > 0, got 0.0"),
    (["--device", "cpu", "--pg-backend", "nccl"], r"--device cpu needs --pg-backend in"),
    (["--iters", "0"], r"--iters must be >= 1, got 0"),
    (["--launch-pad-us", "-1"], r"--launch-pad-us must be >= 0, got -1"),
    (["--launch-pad-us", "500", "--pad-busy-blocks", "-1"],
     r"--pad-busy-blocks must be 0 to 65535, got -1"),
    (["--launch-pad-us", "500", "--pad-busy-blocks", "65536"],
     r"--pad-busy-blocks must be 0 to 65535, got 65536"),
    (["--pad-busy-blocks", "132"], r"--pad-busy-blocks 132 needs --launch-pad-us > 0"),
    (["--device", "cpu", "--pg-backend", "gloo", "--launch-pad-us", "500"],
     r"--launch-pad-us 500 needs --device cuda"),
])
def test_validate_args_errors(no_torchrun, extra, pattern):
    with pytest.raises(ValueError, match=pattern):
        bench.parse_args(SMALL + extra)


def test_validate_uses_world_size_under_torchrun(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"divisible by the number of ranks 3"):
        bench.parse_args(SMALL)  # --num-ranks 2 is ignored


def test_defaults_config_and_cli_override(no_torchrun):
    a = bench.parse_args([])
    assert (a.backend, a.num_ranks, a.num_experts, a.hidden_size, a.top_k, a.num_tokens, a.dtype,
            a.routing_mode, a.hot_experts, a.hot_fraction, a.zipf_alpha, a.zero_copy,
            a.async_finish, a.return_recv_hook, a.pg_backend, a.warmup_iters, a.iters, a.seed,
            a.json_output, a.master_addr, a.master_port) == (
        "cuda", 8, 256, 7168, 8, 1024, "bf16", "uniform", 32, 0.9, 1.0, False, False, False,
        "nccl", 20, 100, 0, None, "127.0.0.1", 29500)
    cfg = os.path.join(BENCH, "configs", "cuda_zipfian.json")
    a = bench.parse_args(["--config", cfg, "--iters", "5", "--no-zero-copy"])
    assert (a.routing_mode, a.zipf_alpha, a.iters, a.zero_copy, a.async_finish) == (
        "zipf", 1.0, 5, False, True)
    for name, mode in (("cuda_uniform.json", "uniform"), ("cuda_incast_k_hot.json", "k_hot")):
        a = bench.parse_args(["--config", os.path.join(BENCH, "configs", name)])
        assert a.routing_mode == mode and a.zero_copy and a.pg_backend == "nccl"


def test_unknown_config_key(tmp_path, no_torchrun):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"num_expert": 8}))
    with pytest.raises(ValueError, match=r"unknown keys \['num_expert'\]"):
        bench.parse_args(["--config", str(path)])


def test_nccl_with_more_ranks_than_gpus_is_refused(monkeypatch, no_torchrun):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(RuntimeError, match=r"--pg-backend nccl needs one GPU per rank: 8 ranks"):
        bench.check_environment(bench.parse_args([]), 8)


def _smoke(tmp_path, pg_backend, extra):
    out = tmp_path / "result.json"
    cmd = [sys.executable, os.path.join(BENCH, "run_ep_benchmark.py"), "--device", "cpu",
           "--pg-backend", pg_backend, *SMALL, "--num-tokens", "8", "--warmup-iters", "1",
           "--iters", "3", "--master-port", str(harness.free_port()), "--json-output", str(out),
           *extra]
    env = harness.child_env({"RANK": None, "WORLD_SIZE": None})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert metrics.schema_errors(doc, 2) == [], doc
    assert doc["ep_path"] == "fallback" and doc["timer"] == "wall_clock"
    assert doc["timeouts"] == {}, doc["timeouts"]  # no op ended at its deadline
    return doc, proc.stderr


def test_cpu_smoke_gloo_k_hot_fp8_compare_and_plot(tmp_path):
    png = tmp_path / "plot.png"
    doc, err = _smoke(tmp_path, "gloo", ["--routing-mode", "k_hot", "--hot-experts", "2",
                                         "--dtype", "fp8", "--async-finish", "--compare",
                                         "--plot", str(png)])
    assert doc["hot_experts"] == 2 and doc["compare"]["fast_path"] is None
    assert "fast path is unavailable" in doc["compare"]["note"] and "ran the fallback only" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cpu_smoke_mooncake_cpu_zipf_hook(tmp_path):
    err = harness.backend_import_error("mooncake-cpu")
    if err is not None:
        pytest.fail(f"mooncake-cpu is not available: {err}", pytrace=False)
    doc, _ = _smoke(tmp_path, "mooncake-cpu", ["--routing-mode", "zipf", "--return-recv-hook",
                                                "--align-ranks"])
    assert doc["pg_backend"] == "mooncake-cpu" and doc["zipf_alpha"] == 1.0
    assert doc["metrics"]["expert_load"]["mean_tokens_per_expert"] == 8 * 2 * 2 / 8
    # 8 tokens x top-2 x 2 ranks, BF16 rows both ways; no copy rate on the CPU.
    bw = doc["bandwidth"]
    assert bw["dispatch_payload_bytes"] == bw["combine_payload_bytes"] == 32 * 2 * doc["hidden_size"]
    for op in ("dispatch", "combine"):  # each of the 2 ranks' share
        assert bw[f"{op}_payload_bytes_per_s_per_rank"] == bw[f"{op}_payload_bytes_per_s"] / 2
    assert bw["device_copy_bytes_per_s"] is None and "dispatch_fraction_of_copy_rate" not in bw
    assert bw["device_copy_traffic_bytes_per_s"] is None
    # With hooks each op's send half is timed apart: it ends before the op does.
    halves = doc["send_half_latency_ms"]
    for op in ("dispatch", "combine"):
        assert 0 < halves[op]["p50"] <= doc["metrics"][f"{op}_latency_ms"]["p50"], (op, doc)


def test_a_step_that_timed_out_is_noted_and_its_ranks_restored(capsys, no_torchrun):
    log = timeouts.TimeoutLog(rank=2)
    active = torch.ones(4, dtype=torch.int32)
    log.after_step(active)  # warmup step 0: clean
    log.start("measured")
    log.after_step(active)  # measured step 0: clean
    active[1] = 0
    active[3] = 0
    log.after_step(active)  # measured step 1: ranks 1 and 3 timed out
    assert active.tolist() == [1, 1, 1, 1]
    active[3] = 0
    log.start("trace")
    log.after_step(active)
    assert log.events == [{"phase": "measured", "step": 1, "sources": [1, 3]},
                          {"phase": "trace", "step": 0, "sources": [3]}]
    # One line on stderr, at the first timeout only.
    assert capsys.readouterr().err == ("rank 2: an op timed out waiting for ranks [1, 3] "
                                       "(measured step 1); see the JSON's 'timeouts'\n")
    assert bench.parse_args([]).timeout_us == 10_000_000  # a deadline by default, not a hang


def test_payload_bytes_and_bandwidth_by_hand():
    # FP8: 256 data bytes + 2 scales of 4 bytes per copy; combine: 512 BF16 bytes.
    assert metrics.payload_bytes(10, 256, True) == (2640, 5120)
    assert metrics.payload_bytes(10, 256, False) == (5120, 5120)
    bw = metrics.bandwidth_summary(2000, 4000, 2.0, 4.0, 4e6, 4)
    assert bw["dispatch_payload_bytes_per_s"] == 1e6 and bw["combine_payload_bytes_per_s"] == 1e6
    # A rank's share, as DeepEP and NCCL EP count it: 4 ranks, a quarter each.
    assert bw["dispatch_payload_bytes_per_s_per_rank"] == 2.5e5
    assert bw["combine_payload_bytes_per_s_per_rank"] == 2.5e5
    with pytest.raises(ValueError, match="num_ranks=0"):
        metrics.bandwidth_summary(2000, 4000, 2.0, 4.0, 4e6, 0)
    assert bw["dispatch_fraction_of_copy_rate"] == 0.25 == bw["combine_fraction_of_copy_rate"]
    assert bw["device_copy_traffic_bytes_per_s"] == 8e6  # read + write of each byte copied


def test_cpu_smoke_elastic_buffer_names_its_transport(tmp_path):
    """--ep-transport auto measures an ElasticBuffer; the JSON names the class and the
    transport it resolved to, with the reason (on CPU tensors: the fallback)."""
    doc, _ = _smoke(tmp_path, "gloo", ["--ep-transport", "auto"])
    assert doc["ep_buffer"] == "ElasticBuffer", doc
    assert doc["ep_transport"] in ("ibgda", "nccl") and doc["ep_transport_reason"], doc
    plain, _ = _smoke(tmp_path, "gloo", [])
    assert plain["ep_buffer"] == "Buffer" and "ep_transport" not in plain, plain


def _fake_trace(layout, marks):
    """A trace with marks[(kernel, block, mark)] = ns, the rest 0."""
    t = torch.zeros(layout["slots"], dtype=torch.int64)
    nk, nm = len(layout["kernels"]), len(layout["marks"])
    view = t.view(nk, layout["max_blocks"], nm)
    for (kernel, block, mark), ns in marks.items():
        view[layout["kernels"].index(kernel), block, layout["marks"].index(mark)] = ns
    return t


def test_phase_trace_timeline_by_hand():
    layout = {"kernels": ["dispatch_send", "dispatch_receive", "combine_send", "combine_receive"],
              "marks": ["start", "middle", "end"], "max_blocks": 8, "slots": 4 * 8 * 3}
    base = 1_000_000_000

    def rank_trace(shift_ns):
        m = {}
        for b, (s, w, e) in enumerate([(0, 4000, 5000), (1000, 6000, 7000)]):
            m[("dispatch_send", b, "start")] = base + shift_ns + s
            m[("dispatch_send", b, "middle")] = base + shift_ns + w
            m[("dispatch_send", b, "end")] = base + shift_ns + e
        for b, (s, w, e) in enumerate([(8000, 20000, 30000), (8000, 12000, 25000)]):
            m[("dispatch_receive", b, "start")] = base + shift_ns + s
            m[("dispatch_receive", b, "middle")] = base + shift_ns + w
            m[("dispatch_receive", b, "end")] = base + shift_ns + e
        m[("combine_send", 0, "start")] = base + 100_000 + shift_ns  # no middle: inactive
        m[("combine_receive", 0, "start")] = base + 101_000 + shift_ns
        m[("combine_receive", 0, "end")] = base + 102_000 + shift_ns
        return _fake_trace(layout, m)

    s0 = phase_trace.summarize(rank_trace(0), layout)
    assert s0["dispatch_send"] == {"start": base, "middle_min": base + 4000,
                                   "middle_max": base + 6000, "end": base + 7000,
                                   "block": 5000, "block_middle": 4000,  # lower medians
                                   "truncated": False}
    assert s0["combine_send"]["middle_min"] is None
    # rank 1 starts 2 us later; two steps, the second rank 1 3 us later
    steps = [[s0, phase_trace.summarize(rank_trace(0), layout)],
             [phase_trace.summarize(rank_trace(2000), layout),
              phase_trace.summarize(rank_trace(3000), layout)]]
    doc = phase_trace.report(steps)
    assert doc["steps"] == 2
    r0, r1 = doc["dispatch"]["per_rank"]
    assert r0 == {"pad": None, "send_start": 0.0, "send_written": 6.0, "send_end": 7.0,
                  "receive_start": 8.0, "first_wait_min": 12.0, "first_wait_max": 20.0,
                  "receive_end": 30.0, "event_end": None, "send_block": 5.0,
                  "send_block_middle": 4.0, "receive_block": 17.0, "receive_block_middle": 4.0}
    assert r1["send_start"] == 2.5 and r1["receive_end"] == 32.5  # median of 2 and 3 us late
    # the slowest rank's own fields (rank 1 ends last in both steps), not a mix
    assert doc["dispatch"]["slowest"] == r1
    # each step's own end, which the medians would hide for a step that stalled
    assert doc["dispatch"]["per_step"] == [{"slowest_rank": 1, "receive_end": 32.0},
                                           {"slowest_rank": 1, "receive_end": 33.0}]
    assert doc["combine"]["per_step"] == [{"slowest_rank": 1, "receive_end": 4.0},
                                          {"slowest_rank": 1, "receive_end": 5.0}]
    assert doc["truncated"] == []
    c0 = doc["combine"]["per_rank"][0]
    assert c0["send_written"] is None and c0["receive_end"] == 2.0
    text = phase_trace.format_table(doc)
    assert "dispatch" in text and "max" in text and text.count("\n") == 1 + 3 + 3
    # ranks on several GPUs: each rank's timeline starts at its own send
    apart = phase_trace.report(steps, shared_clock=False)
    assert apart["dispatch"]["per_rank"][1] == r0 and "own" in apart["unit"]
    # the pad's instant and the completion event, on the same timeline: the
    # pad ended 3 us before the first send block, the event 40 us after it
    ops = {"dispatch": {"pad_ns": base - 3000, "latency_us": 43.0}}
    padded = phase_trace.report([[phase_trace.summarize(rank_trace(0), layout, ops)]])
    row = padded["dispatch"]["per_rank"][0]
    assert row["pad"] == -3.0 and row["event_end"] == 40.0 and row["receive_end"] == 30.0
    assert padded["combine"]["per_rank"][0]["pad"] is None


def test_phase_trace_flags_grids_past_the_traced_blocks():
    layout = {"kernels": ["dispatch_send", "dispatch_receive", "combine_send", "combine_receive"],
              "marks": ["start", "middle", "end"], "max_blocks": 4, "slots": 4 * 4 * 3}
    full = {("combine_receive", b, m): 10 + b for b in range(4) for m in ("start", "end")}
    full[("dispatch_send", 0, "start")] = 5
    doc = phase_trace.report([[phase_trace.summarize(_fake_trace(layout, full), layout)]])
    assert doc["truncated"] == ["combine_receive"]


class _NoFastPath:
    use_fast_path = False


def test_phase_trace_says_why_it_cannot_trace():
    worker = types.SimpleNamespace(buffer=_NoFastPath())
    summaries, reason = phase_trace.trace_steps(worker, 3, runtime=None)
    assert summaries is None and "fallback" in reason
    elastic = types.SimpleNamespace(_inner=types.SimpleNamespace(use_fast_path=True, _fast=None))
    summaries, reason = phase_trace.trace_steps(types.SimpleNamespace(buffer=elastic), 3, None)
    assert summaries is None and "NCCL" in reason

    class Refusing:
        def set_phase_trace(self, trace):
            raise ValueError("no")
    buffer = types.SimpleNamespace(use_fast_path=True, _fast=Refusing(), ibgda_peers=[])
    runtime = types.SimpleNamespace(phase_trace_layout=lambda: {
        "kernels": ["dispatch_send"], "marks": ["start", "middle", "end"], "max_blocks": 1,
        "slots": 3})
    summaries, reason = phase_trace.trace_steps(
        types.SimpleNamespace(buffer=buffer, device=torch.device("cpu")), 3, runtime)
    assert summaries is None and "ValueError: no" in reason


def test_phase_trace_needs_cuda(no_torchrun):
    with pytest.raises(ValueError, match="--phase-trace 4 needs --device cuda"):
        bench.validate_args(bench.parse_args(["--device", "cpu", "--pg-backend", "gloo",
                                              "--phase-trace", "4"]))


def test_phase_trace_reads_the_extensions_layout():
    from mooncake import _ep_runtime
    runtime = _ep_runtime.runtime()
    if runtime is None:
        pytest.skip("the EP extension is not built here")
    layout = runtime.phase_trace_layout()
    assert layout["slots"] == len(layout["kernels"]) * layout["max_blocks"] * len(layout["marks"])
    for send, receive in phase_trace.OPS.values():
        assert send in layout["kernels"] and receive in layout["kernels"]
    summary = phase_trace.summarize(torch.zeros(layout["slots"], dtype=torch.int64), layout)
    kernels = [summary[k] for k in layout["kernels"]]
    assert all(v is None for k in kernels for f, v in k.items() if f != "truncated")
    assert not any(k["truncated"] for k in kernels) and summary["ops"] == {}


def test_clock_samples_parse_and_summarize_by_hand():
    assert clocks.parse_sample("705, 1980, 124.74\n") == (705.0, 1980.0, 124.74)
    assert clocks.parse_sample("585, 1980, [N/A]") == (585.0, 1980.0, None)
    assert clocks.parse_sample("[N/A], 1980, 90.0") is None  # no SM clock, no sample
    assert clocks.parse_sample("No devices were found") is None
    rec = clocks.summarize([(705.0, 1980.0, 124.0), (585.0, 1980.0, 108.0), (645.0, 1980.0, None)])
    assert rec == {"samples": 3, "sm_mhz": {"min": 585.0, "median": 645.0, "max": 705.0},
                   "max_sm_mhz": 1980.0, "power_w": {"min": 108.0, "median": 116.0, "max": 124.0}}
    line = clocks.describe(rec)
    assert "median 645 MHz (min 585, max 705; the device's maximum 1980), 3 samples" in line
    assert "power median 116 W" in line
    none = clocks.summarize([], "nvidia-smi could not run: not found")
    assert none == {"samples": 0, "unavailable": "nvidia-smi could not run: not found"}
    assert "not sampled (nvidia-smi could not run: not found)" in clocks.describe(none)
    assert clocks.nvidia_smi_id("5f3c-aa") == "GPU-5f3c-aa"
    assert clocks.nvidia_smi_id("GPU-5f3c-aa") == "GPU-5f3c-aa"


def test_clock_sampler_reads_samples_while_its_body_runs(tmp_path):
    # A stand-in for nvidia-smi -lms: prints a sample, then waits for a file
    # the body writes, prints two more and a non-sample, then idles until
    # terminated. The record holds exactly the three samples.
    gate = tmp_path / "gate"
    script = ("import os, sys, time\n"
              "print('700, 1980, 120.5', flush=True)\n"
              f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)\n"
              "print('600, 1980, 100.0', flush=True)\n"
              "print('650, 1980, 110.0', flush=True)\n"
              "print('Unknown Error', flush=True)\n"
              "time.sleep(60)\n")
    sampler = clocks.ClockSampler(0, command=[sys.executable, "-c", script])
    with sampler:
        gate.write_text("go")
        deadline = time.monotonic() + 20
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    rec = sampler.record()
    assert rec["samples"] == 3, rec
    assert rec["sm_mhz"] == {"min": 600.0, "median": 650.0, "max": 700.0}
    assert rec["power_w"]["median"] == 110.0


def test_clock_sampler_says_why_it_has_no_samples():
    with clocks.ClockSampler(0, command=["/nonexistent/nvidia-smi-for-this-test"]) as s:
        pass
    rec = s.record()
    assert rec["samples"] == 0 and "could not run" in rec["unavailable"], rec
    with clocks.ClockSampler(0, command=[sys.executable, "-c", "print('No devices were found')"]) as s:
        pass
    rec = s.record()
    assert rec["samples"] == 0 and "printed no sample" in rec["unavailable"], rec
