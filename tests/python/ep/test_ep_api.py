"""Single-process parts of the EP API: size hint, FP8 format, EventOverlap, mooncake.ep."""

import importlib
import itertools
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mooncake import _ep_fast, _ep_runtime
from mooncake.mooncake_ep_buffer import (FORCE_FALLBACK_ENV, Buffer, EventOverlap, fp8_dequantize,
                                         fp8_quantize)


def test_size_hint_matches_the_documented_formula(monkeypatch):
    # Without direct dispatch's slots (MC_EP_DIRECT_DISPATCH=0): 256 B of state
    # + 2 halves x (signals: 16 B per expert rounded to 256 B, dispatch: experts
    # x slots x (128 B header + BF16 row), combine: experts x slots x BF16 row).
    monkeypatch.setenv(_ep_fast.DIRECT_DISPATCH_ENV, "0")
    base = 256 + 2 * (4096 + 256 * 128 * (128 + 14336) + 256 * 128 * 14336)
    assert Buffer.get_ep_buffer_size_hint(128, 7168, 8, 256) == base
    # 3 experts: 48 bytes of signal round up to 256.
    small = 256 + 2 * (256 + 3 * 384 + 3 * 256)
    assert Buffer.get_ep_buffer_size_hint(1, 128, 3, 3) == small
    # By default, plus the direct area: a header (8 B per expert, 16, 16 B per
    # (local expert, rank), rounded to 256 B), then 3 slots of [local experts]
    # row counters (8 B), FP8 rows, float scales per 128 channels and int
    # src_info, each over local experts x num_ranks * max_tokens rows and each
    # rounded to 256 B.
    monkeypatch.delenv(_ep_fast.DIRECT_DISPATCH_ENV)
    rows = 32 * 8 * 128
    slot = 256 + rows * 7168 + rows * 56 * 4 + rows * 4
    assert Buffer.get_ep_buffer_size_hint(128, 7168, 8, 256) == base + 6400 + 3 * slot
    # 1 local expert, 3 rows of 128 channels: 256 (header) + 3 x (256 + 512 + 256 + 256).
    assert Buffer.get_ep_buffer_size_hint(1, 128, 3, 3) == small + 256 + 3 * 1280


def test_python_size_hint_equals_the_runtime_formula():
    module = _ep_runtime.runtime()
    if module is None:
        pytest.skip(f"the compiled EP runtime does not import here: {_ep_runtime._load()[1]}")
    for args in itertools.product((1, 7, 128, 1024), (128, 1024, 7168, 8192), (1, 2, 3, 8),
                                  (1, 3), (False, True)):
        max_tokens, hidden, ranks, per_rank, direct = args
        experts = ranks * per_rank * 8
        want = module.buffer_size_hint(max_tokens, hidden, ranks, experts, direct=direct)
        assert _ep_fast.size_hint_python(max_tokens, hidden, ranks, experts, direct) == want, args
        assert _ep_fast.size_hint(max_tokens, hidden, ranks, experts, direct=direct) == want, args


def test_size_hint_arguments_are_checked():
    with pytest.raises(ValueError, match=r"num_max_dispatch_tokens_per_rank must be >= 1, got 0"):
        Buffer.get_ep_buffer_size_hint(0, 128, 2, 2)
    with pytest.raises(TypeError, match=r"hidden must be an int, got 128.0"):
        Buffer.get_ep_buffer_size_hint(1, 128.0, 2, 2)


def test_fp8_scales_are_amax_over_448_with_a_floor():
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[0, :128] = torch.linspace(-3.5, 2.0, 128).to(torch.bfloat16)
    x[0, 128:] = 0.25
    # row 1 stays zero: its scale uses the 1e-4 floor
    data, scales = fp8_quantize(x)
    assert data.dtype == torch.float8_e4m3fn and data.shape == (2, 256)
    assert scales.dtype == torch.float32 and scales.shape == (2, 2)
    want = torch.tensor([[3.5 / 448, 0.25 / 448], [1e-4 / 448, 1e-4 / 448]], dtype=torch.float32)
    assert torch.equal(scales, want), (scales, want)
    back = fp8_dequantize(data, scales)
    assert back.dtype == torch.bfloat16
    assert torch.equal(back[0, 128:], x[0, 128:]) and not bool(back[1].any())
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself (plus BF16 rounding).
    err = (back[0, :128].float() - x[0, :128].float()).abs()
    assert bool((err <= x[0, :128].float().abs() / 16 + 1e-2).all())
    # The block's largest magnitude maps to the FP8 maximum exactly.
    assert data[0, 0].float() == -448.0


def test_fp8_quantize_follows_the_kernel_rule_bit_for_bit():
    # The kernels (mooncake-ep/core/fp8_rule.h) store amax / 448 and E4M3(x * (448 / amax)),
    # both IEEE float32 operations; numpy's float32 division is IEEE, so this is an
    # independent reference. x / (amax / 448) rounds differently for some values.
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 1024, generator=gen) * 3).to(torch.bfloat16)
    blocks = x.float().view(64, 8, 128).numpy()
    amax = np.maximum(np.abs(blocks).max(axis=-1), np.float32(1e-4)).astype(np.float32)
    inv = (np.float32(448.0) / amax).astype(np.float32)
    scaled = torch.from_numpy((blocks * inv[..., None]).astype(np.float32))
    want_data = scaled.to(torch.float8_e4m3fn).view(64, 1024)
    want_scales = torch.from_numpy((amax / np.float32(448.0)).astype(np.float32))
    data, scales = fp8_quantize(x)
    assert torch.equal(scales, want_scales)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))


def test_event_overlap_without_an_event_is_a_no_op():
    held = torch.ones(2)
    ev = EventOverlap(None, [held])
    ev.current_stream_wait()
    with ev as entered:
        assert entered is ev
    assert ev.extra_tensors[0] is held


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: orders a stream after an event")
def test_event_overlap_waits_on_cuda():
    event = torch.cuda.Event()
    event.record()
    EventOverlap(event).current_stream_wait()
    torch.cuda.synchronize()


@pytest.mark.skipif(_ep_runtime.runtime() is None, reason="the EP runtime is not built here")
@pytest.mark.parametrize("min_us,period_us", [(0, 10), (10, 0), (-1, 10), (float("nan"), 10)])
def test_the_benchmarks_aligned_pad_checks_its_arguments_before_any_cuda_call(min_us, period_us):
    with pytest.raises(ValueError, match="min_us and period_us must be >= 1"):
        _ep_runtime.runtime().aligned_pad(min_us, period_us)


@pytest.mark.skipif(_ep_runtime.runtime() is None, reason="the EP runtime is not built here")
@pytest.mark.parametrize("target_ns,max_wait_ns,message", [
    (0, 10, r"target_ns must be > 0 .*got 0"), (-5, 10, r"target_ns must be > 0 .*got -5"),
    (10, 0, r"max_wait_ns must be > 0, got 0")])
def test_the_benchmarks_pad_until_checks_its_arguments_before_any_cuda_call(target_ns, max_wait_ns,
                                                                             message):
    with pytest.raises(ValueError, match=message):
        _ep_runtime.runtime().pad_until(target_ns, max_wait_ns)


@pytest.mark.skipif(_ep_runtime.runtime() is None, reason="the EP runtime is not built here")
@pytest.mark.parametrize("busy_blocks", [-1, 65536])
def test_the_benchmarks_busy_pads_check_their_block_count_before_any_cuda_call(busy_blocks):
    rt = _ep_runtime.runtime()
    with pytest.raises(ValueError, match=f"aligned_pad: busy_blocks must be 0 .* to 65535, got "
                                         f"{busy_blocks}"):
        rt.aligned_pad(10, 20, busy_blocks)
    with pytest.raises(ValueError, match=f"pad_until: busy_blocks must be 0 .* to 65535, got "
                                         f"{busy_blocks}"):
        rt.pad_until(10, 10, busy_blocks=busy_blocks)


def test_mooncake_ep_imports_without_the_runtime_and_says_why():
    sys.modules.pop("mooncake.ep", None)
    ep = importlib.import_module("mooncake.ep")
    assert ep.Buffer is Buffer
    if _ep_runtime.runtime() is None:
        assert ep.FAST_PATH_AVAILABLE is False
        assert "Mooncake EP runtime was not built against torch==" in ep.FAST_PATH_UNAVAILABLE_REASON


def test_one_rank_buffer_round_trip(monkeypatch):
    # The fallback's exact layout (test_ep_fast.py covers the fast path).
    monkeypatch.setenv(FORCE_FALLBACK_ENV, "1")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        buf = Buffer(dist.group.WORLD, Buffer.get_ep_buffer_size_hint(4, 128, 1, 2))
        assert buf.use_fast_path is False and buf.fast_path_reason
        assert buf.ibgda_peers == []
        x = torch.arange(4 * 128, dtype=torch.float32).view(4, 128).to(torch.bfloat16)
        idx = torch.tensor([[0, 1], [1, -1], [-1, -1], [1, 0]], dtype=torch.int64)
        w = torch.tensor([[0.5, 0.25], [2.0, 9.0], [9.0, 9.0], [1.0, 1.0]])
        act = torch.ones(1, dtype=torch.int32)
        recv, count, handle, _, _ = buf.dispatch(x, idx, act, 4, 2, -1, use_fp8=False)
        assert count.tolist() == [2, 3]
        # Packed per expert, by source rank then token: expert 0 <- tokens 0, 3; expert 1 <- 0, 1, 3.
        assert handle[0][0, :2].tolist() == [0, 3] and handle[0][1, :3].tolist() == [0, 1, 3]
        assert handle[1].tolist() == [[2], [3]]  # (begin 0 << 32) | count
        assert torch.equal(recv[0, :2], x[[0, 3]]) and torch.equal(recv[1, :3], x[[0, 1, 3]])
        out, _, _ = buf.combine(recv, idx, w, act, -1, handle)
        want = x.float() * torch.tensor([0.75, 2.0, 0.0, 2.0]).view(-1, 1)
        assert torch.equal(out, want.to(torch.bfloat16))
    finally:
        dist.destroy_process_group()
