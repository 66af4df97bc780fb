"""pgbench's tables by hand (constructed rows, no ranks): the ratio against whichever
peer ran (gloo or nccl), busbw over the GPU-to-GPU link copy, and the option errors
that keep nccl and --gpus per-rank to runs that can work. One CPU smoke run checks
the JSON a real run writes."""

import json
import os
import subprocess
import sys

import pytest

import harness

BENCH = os.path.join(harness.REPO_ROOT, "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import pgbench  # noqa: E402


def _row(backend, coll, size, time_us, busbw):
    return {"backend": backend, "collective": coll, "size": size, "time_us_median": time_us,
            "time_us_p99": 2 * time_us, "busbw_GBps": busbw}


def test_ratios_are_against_the_peer_that_ran():
    rows = [_row("mooncake", "all_reduce", 1024, 10.0, 40.0),
            _row("nccl", "all_reduce", 1024, 20.0, 50.0),
            _row("mooncake", "all_gather", 1024, 8.0, 30.0)]  # no nccl row: no ratio
    (r,) = pgbench.ratios(rows)
    assert r["peer"] == "nccl" and r["collective"] == "all_reduce" and r["size"] == 1024
    assert r["busbw_ratio"] == pytest.approx(0.8)
    assert r["latency_ratio"] == pytest.approx(0.5) and r["latency_ratio_p99"] == pytest.approx(0.5)

    gloo = [_row("mooncake-cpu", "all_reduce", 8, 30.0, 0.5), _row("gloo", "all_reduce", 8, 120.0, 0.1)]
    (g,) = pgbench.ratios(gloo)
    assert g["peer"] == "gloo" and g["busbw_ratio"] == pytest.approx(5.0)
    assert g["latency_ratio"] == pytest.approx(0.25)
    assert pgbench.ratios([_row("mooncake", "all_reduce", 8, 1.0, 1.0)]) == []


def test_link_fractions_read_every_row_against_the_link_copy():
    rows = [_row("mooncake", "all_reduce", 1 << 20, 10.0, 120.0),
            _row("nccl", "all_reduce", 1 << 20, 9.0, 150.0),
            _row("link_copy", "link_copy", 256 << 20, 800.0, 300.0)]
    fr = pgbench.link_fractions(rows)
    assert [(x["backend"], round(x["busbw_over_link"], 6)) for x in fr] == [("mooncake", 0.4), ("nccl", 0.5)]
    assert all(x["link_GBps"] == 300.0 for x in fr)
    assert pgbench.link_fractions(rows[:2]) == []


def test_launch_floor_rows_are_read_against_and_kept_out_of_the_limit():
    floor = dict(_row(pgbench.LAUNCH_FLOOR, "all_reduce", 8, 18.5, 0.0), issue_us_median=18.0, nranks=2)
    rows = [dict(_row("mooncake", "all_reduce", 8, 26.0, 0.0), nranks=2), floor,
            dict(_row("gloo", "all_reduce", 8, 160.0, 0.0), nranks=2),
            dict(_row("mooncake", "all_reduce", 64, 27.0, 0.0), nranks=2),  # another size: no floor
            dict(_row("device_copy", "device_copy", 1 << 28, 100.0, 4000.0), nranks=1)]
    got = {x["backend"]: x for x in pgbench.launch_floors(rows)}
    assert sorted(got) == ["gloo", "mooncake"]
    assert got["mooncake"]["over_floor_us"] == pytest.approx(7.5)
    assert got["gloo"]["over_floor_us"] == pytest.approx(141.5)
    assert got["mooncake"]["floor_issue_us"] == 18.0
    assert pgbench.LAUNCH_FLOOR not in {x["backend"] for x in pgbench.limit_fractions(rows)}
    assert pgbench.launch_floors(rows[:1]) == []


@pytest.mark.parametrize("argv,needle", [
    (["--peer", "nccl"], "nccl needs --device cuda --gpus per-rank (got --device cpu --gpus shared)"),
    (["--device", "cuda", "--peer", "nccl"], "(got --device cuda --gpus shared)"),
    (["--backend", "nccl", "--device", "cuda"], "nccl needs --device cuda --gpus per-rank"),
    (["--gpus", "per-rank"], "--gpus per-rank: expected --device cuda"),
    (["--peer", "mpi"], "invalid choice: 'mpi'"),
])
def test_options_that_cannot_work_are_refused_naming_them(argv, needle):
    out = subprocess.run([sys.executable, os.path.join(BENCH, "pgbench.py")] + argv,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and needle in out.stderr, out.stderr


def test_a_cpu_run_writes_ratios_naming_gloo(tmp_path):
    path = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(harness.REPO_ROOT, "python"))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "pgbench.py"), "-g", "2", "-b", "8", "-e", "8",
                          "--iters", "5", "--rounds", "1", "--time-budget", "0.1", "--min-iters", "2",
                          "--json-output", str(path)], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(path.read_text())
    assert {r["backend"] for r in data["results"]} >= {"mooncake-cpu", "gloo"}
    assert all(r["check"] == "ok" for r in data["results"] if r["backend"] != "memcpy")
    assert [x["peer"] for x in data["ratios"]] == ["gloo"]
    assert data["link_fractions"] == [] and "ratio mooncake-cpu / gloo" in out.stdout
    for r in data["results"]:  # the collective worker's host time per op, mooncake only
        if r["backend"] == "mooncake-cpu":
            assert r["worker_run_us_mean"] > 0 and r["worker_queued_us_mean"] >= 0, r
            # Only synchronous CUDA kernel calls may be launched by their caller.
            assert r["caller_launched_fraction"] == 0.0, r
        elif r["backend"] == "gloo":
            assert r["worker_run_us_mean"] is None and r["worker_queued_us_mean"] is None, r
            assert r["caller_launched_fraction"] is None, r


def _count_worker_ops(ctx):
    import torch
    import torch.distributed as dist
    from mooncake import pg
    t = torch.ones(4)
    dist.barrier()
    before = pg._lib._worker_stats(dist.group.WORLD)
    for _ in range(7):
        dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    after = pg._lib._worker_stats(dist.group.WORLD)
    return (after["ops"] - before["ops"], after["run_us"] - before["run_us"],
            after["queued_us"] - before["queued_us"])


def test_worker_stats_count_every_op_before_it_completes():
    # Counted before the Work completes, so a caller back from wait() sees its op.
    for ops, run_us, queued_us in harness.run_ranks(_count_worker_ops, 2, "mooncake-cpu",
                                                    timeout_s=120):
        assert ops == 8 and run_us > 0 and queued_us >= 0, (ops, run_us, queued_us)
