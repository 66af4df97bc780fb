"""MC_PG_CUDA_PATH, MC_PG_CUDA_SLOT_BYTES, MC_PG_CUDA_BLOCKING_WAIT and MC_PG_CUDA_DIRECT:
checked when a
`mooncake` group is created.

A bad value fails init_process_group with the variable, the value and the
accepted ones named, on any machine (the settings are read before any CUDA
op). With the kernel path chosen, CPU tensors on a `mooncake` group still take
the CPU path. The CUDA data itself is checked in test_cuda.py (GPU only).
"""

import pytest
import torch
import torch.distributed as dist

import harness

BACKEND = "mooncake"
JOB_TIMEOUT_S = 120


def _init_outcome(ctx):
    try:
        ctx.init()
    except Exception as e:  # noqa: BLE001 - the text is the result
        return f"{type(e).__name__}: {e}"
    t = torch.full((4,), float(ctx.rank + 1))
    dist.all_reduce(t)
    return t.tolist()


@pytest.mark.parametrize("var,value,expect", [
    ("MC_PG_CUDA_PATH", "kernel", ["MC_PG_CUDA_PATH='kernel'", "'staged'", "'kernels'"]),
    ("MC_PG_CUDA_PATH", "NCCL", ["MC_PG_CUDA_PATH='NCCL'", "'staged'", "'kernels'"]),
    ("MC_PG_CUDA_SLOT_BYTES", "1000", ["MC_PG_CUDA_SLOT_BYTES='1000'", "multiple of 16"]),
    ("MC_PG_CUDA_SLOT_BYTES", "1M", ["MC_PG_CUDA_SLOT_BYTES='1M'", "multiple of 16"]),
    ("MC_PG_CUDA_BLOCKING_WAIT", "yes", ["MC_PG_CUDA_BLOCKING_WAIT='yes'", "'0'", "'1'"]),
    ("MC_PG_CUDA_DIRECT", "yes", ["MC_PG_CUDA_DIRECT='yes'", "'0'", "'1'"]),
])
def test_bad_setting_fails_init_naming_it(var, value, expect):
    res = harness.run_ranks(_init_outcome, 1, BACKEND, timeout_s=JOB_TIMEOUT_S, init=False,
                            ref_group=False, env={var: value})
    text = res[0]
    assert isinstance(text, str), f"init_process_group accepted {var}={value!r}: {text}"
    for piece in expect:
        assert piece in text, (piece, text)


@pytest.mark.parametrize("path", ["staged", "kernels", ""])
def test_accepted_paths_keep_cpu_tensors_on_the_cpu_path(path):
    res = harness.run_ranks(_init_outcome, 2, BACKEND, timeout_s=JOB_TIMEOUT_S, init=False,
                            ref_group=False,
                            env={"MC_PG_CUDA_PATH": path, "MC_PG_CUDA_SLOT_BYTES": "4096"})
    assert res == [[3.0] * 4, [3.0] * 4], res


def _init_only(ctx):
    try:
        ctx.init()
    except Exception as e:  # noqa: BLE001 - the text is the result
        return f"{type(e).__name__}: {e}"
    return "ok"


@pytest.mark.parametrize("rank1_env", [{"MC_PG_CUDA_PATH": "kernels"},
                                       {"MC_PG_CUDA_SLOT_BYTES": "4096"},
                                       {"MC_PG_CUDA_DIRECT": "0"}])
def test_ranks_with_different_settings_fail_init_naming_both(rank1_env):
    # Rank 1 differs from rank 0 (the defaults): it learns so at init, with
    # both ranks' settings named, instead of timing out at every CUDA op.
    res = harness.run_ranks(_init_only, 2, BACKEND, timeout_s=JOB_TIMEOUT_S, init=False,
                            ref_group=False, rank_env={1: rank1_env},
                            env={"MC_PG_CUDA_PATH": "staged", "MC_PG_CUDA_SLOT_BYTES": None,
                                 "MC_PG_CUDA_DIRECT": None})
    assert res[0] == "ok", res
    text = res[1]
    assert "MC_PG_CUDA_PATH=staged, MC_PG_CUDA_SLOT_BYTES=1048576" in text, text
    var, value = next(iter(rank1_env.items()))
    assert f"{var}={value}" in text and "rank 0 has" in text, text
    assert "every rank must set the same" in text, text


def test_mooncake_cpu_ignores_the_settings():
    # The settings concern CUDA tensors; `mooncake-cpu` never reads them.
    res = harness.run_ranks(_init_outcome, 2, "mooncake-cpu", timeout_s=JOB_TIMEOUT_S,
                            init=False, ref_group=False, env={"MC_PG_CUDA_PATH": "bogus"})
    assert res == [[3.0] * 4, [3.0] * 4], res
