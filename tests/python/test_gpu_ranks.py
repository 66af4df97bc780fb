"""gpu_ranks: where a CUDA test's ranks run and the world sizes it takes (host only)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_ranks  # noqa: E402


def test_world_sizes_add_the_requested_size_once(monkeypatch):
    monkeypatch.delenv(gpu_ranks.WORLD_SIZE_ENV, raising=False)
    assert gpu_ranks.world_sizes(2, 4) == [2, 4]
    monkeypatch.setenv(gpu_ranks.WORLD_SIZE_ENV, "8")
    assert gpu_ranks.world_sizes(2, 4) == [2, 4, 8]
    assert gpu_ranks.world_sizes(2, 3) == [2, 3, 8]
    monkeypatch.setenv(gpu_ranks.WORLD_SIZE_ENV, "4")
    assert gpu_ranks.world_sizes(2, 4) == [2, 4]
    monkeypatch.setenv(gpu_ranks.WORLD_SIZE_ENV, "")
    assert gpu_ranks.world_sizes(2, 3) == [2, 3]


@pytest.mark.parametrize("raw,pattern", [("eight", "expected a number of ranks"),
                                         ("1", "expected at least 2 ranks")])
def test_a_bad_world_size_is_named(monkeypatch, raw, pattern):
    monkeypatch.setenv(gpu_ranks.WORLD_SIZE_ENV, raw)
    with pytest.raises(ValueError, match=f"MC_TEST_WORLD_SIZE=.*{pattern}"):
        gpu_ranks.world_sizes(2, 4)


def test_ranks_share_gpu_0_unless_per_rank(monkeypatch):
    monkeypatch.delenv(gpu_ranks.GPUS_ENV, raising=False)
    assert [gpu_ranks.rank_gpu_index(r, 8) for r in range(4)] == [0, 0, 0, 0]
    monkeypatch.setenv(gpu_ranks.GPUS_ENV, "per-rank")
    assert [gpu_ranks.rank_gpu_index(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [gpu_ranks.rank_gpu_index(r, 8) for r in range(8)] == list(range(8))
    monkeypatch.setenv(gpu_ranks.GPUS_ENV, "each")
    with pytest.raises(ValueError, match="MC_TEST_GPUS='each': expected 'shared' or 'per-rank'"):
        gpu_ranks.rank_gpu_index(0, 8)
