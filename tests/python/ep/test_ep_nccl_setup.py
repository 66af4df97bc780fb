"""The Python side of the NCCL transport's setup, without NCCL or a GPU.

The unique id travels from group rank 0 over the group (here a subgroup, so
"rank 0" is a group rank, not the global one), and a rank whose NCCL setup
fails makes every rank raise, naming it. The compiled NcclBuffer is replaced
by a stand-in that records its arguments; the real one runs on GPUs
(test_elastic_buffer_gpu.py).
"""

import os
import types

import pytest
import torch
import torch.distributed as dist

import harness
from mooncake import _ep_fast, _ep_nccl, _ep_runtime


def _uid_worker(ctx):
    rank = ctx.rank
    # Global ranks 1 and 2 form a group: its rank 0 is global rank 1.
    sub = dist.new_group([1, 2])
    if rank not in (1, 2):
        return None
    made = []

    def make_id():
        made.append(rank)
        return bytes((rank * 7 + i) % 256 for i in range(_ep_nccl.UNIQUE_ID_BYTES))

    uid = _ep_nccl.broadcast_unique_id(sub, dist.get_rank(sub), make_id, torch.device("cpu"))
    return uid, made


def test_unique_id_comes_from_group_rank_0(backend):
    res = harness.run_ranks(_uid_worker, 3, backend, timeout_s=120)
    want = bytes((1 * 7 + i) % 256 for i in range(_ep_nccl.UNIQUE_ID_BYTES))
    assert res[1] == (want, [1]) and res[2] == (want, []), res


class _FakeNcclBuffer:
    """Stands in for the compiled NcclBuffer: fails on the ranks told to."""

    def __init__(self, uid, rank, num_ranks, device, num_experts, max_tokens, hidden,
                 timeout_ms, fail_on=()):
        if rank in fail_on:
            raise RuntimeError("ncclDevCommCreate failed: invalid usage (ncclResult_t 5)")
        self.args = (uid, rank, num_ranks, device, num_experts, max_tokens, hidden)
        self.destroyed = False

    def destroy(self):
        self.destroyed = True


def _setup_worker(ctx, fail_on):
    created = []

    class Fake(_FakeNcclBuffer):
        def __init__(self, *args):
            super().__init__(*args, fail_on=fail_on)
            created.append(self)

    module = types.SimpleNamespace(nccl_unique_id=lambda: b"\x05" * 128, NcclBuffer=Fake)
    _ep_runtime._state = (module, None)
    torch.cuda.current_device = lambda: 0  # the stand-in needs no GPU
    size = 1 << 20
    if fail_on:
        with pytest.raises(RuntimeError) as err:
            _ep_nccl.NcclBuffer(dist.group.WORLD, size, (1, 2), 6, 8, 256)
        text = str(err.value)
        assert text.startswith(f"the NCCL device-API transport could not be set up on ranks "
                               f"{list(fail_on)}"), text
        assert ("ncclDevCommCreate failed" in text) == (ctx.rank in fail_on), text
        assert text.endswith("set MOONCAKE_EP_TRANSPORT=ibgda or pass transport='ibgda' to use "
                             "IPC/IBGDA"), text
        return None
    buf = _ep_nccl.NcclBuffer(dist.group.WORLD, size, (1, 2), 6, 8, 256)
    assert buf.use_fast_path and buf.fast_path_reason is None
    assert created[0].args == (b"\x05" * 128, ctx.rank, 2, 0, 6, 8, 256)
    buf.release(collective=True)
    assert created[0].destroyed and buf._fast is None
    return "ok"


def test_setup_failure_on_one_rank_raises_on_every_rank(backend):
    harness.run_ranks(_setup_worker, 2, backend, timeout_s=120, args=((1,),))
    assert harness.run_ranks(_setup_worker, 2, backend, timeout_s=120, args=((),)) == ["ok"] * 2


def _install_nccl_stand_in(ctx, nccl_buffer_cls):
    """A runtime whose NCCL build, version and 1x2 shape pass the selection, with
    `nccl_buffer_cls` as its NcclBuffer, and one GPU per rank as far as the
    selection can tell (no GPU here)."""
    from mooncake import _ep_transport
    from mooncake._ep_fast import size_hint_python

    module = types.SimpleNamespace(
        nccl_unique_id=lambda: b"\x07" * 128, NcclBuffer=nccl_buffer_cls,
        NCCL_DEVICE_VERSION=_ep_transport.NCCL_MIN_VERSION,
        nccl_runtime_version=lambda: _ep_transport.NCCL_MIN_VERSION,
        NCCL_SHAPES=((1, 2),), buffer_size_hint=size_hint_python)
    _ep_runtime._state = (module, None)
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: ctx.rank
    _ep_fast.device_id = lambda device: 1000 + device  # a GPU id per rank


def _elastic_nccl_worker(ctx):
    """ElasticBuffer selecting NCCL (a stand-in runtime): build, update, destroy order."""
    from ep_checks import check_combine, combine_reference, make_inputs
    from mooncake.mooncake_elastic_buffer import ElasticBuffer

    events = []

    class Fake(_FakeNcclBuffer):
        generation = 0

        def __init__(self, *args):
            super().__init__(*args)
            self.gen = Fake.generation
            Fake.generation += 1
            events.append(f"create {self.gen}")

        def destroy(self):
            events.append(f"destroy {self.gen}")

        def __del__(self):
            events.append(f"drop {self.gen}")

    _install_nccl_stand_in(ctx, Fake)
    world, rank, E = ctx.world_size, ctx.rank, 4
    eb = ElasticBuffer(dist.group.WORLD, 8, 256, 2, num_experts=E)
    assert (eb.transport, eb.transport_reason, eb.topology) == ("nccl", None, (1, 2))
    assert events == ["create 0"], events
    # CPU data on the NCCL generation runs Buffer's fallback: still exact.
    x, idx, w = make_inputs(rank, 8, 256, E, 2, 3)
    act = torch.ones(world, dtype=torch.int32)
    recv, _, handle, _, _ = eb.dispatch(x, idx, act, 8, E, -1, use_fp8=False)
    out, _, _ = eb.combine(recv, idx, w, act, -1, handle)
    check_combine(out, combine_reference(rank, x, idx, w, [1] * world, E // world), False, "nccl")
    # The new generation exists before the old one goes (local teardown: a
    # rank of the old one may be dead, so no collective destroy there).
    eb.update_ep_member()
    assert events == ["create 0", "create 1", "drop 0"], events
    with pytest.raises(ValueError, match=r"predates update_ep_member\(\)"):
        eb.combine(recv, idx, w, act, -1, handle)
    eb.destroy()
    assert events == ["create 0", "create 1", "drop 0", "destroy 1", "drop 1"], events
    return "ok"


def test_elastic_buffer_on_the_nccl_transport_builds_updates_and_destroys(backend):
    assert harness.run_ranks(_elastic_nccl_worker, 2, backend, timeout_s=120) == ["ok"] * 2


def _auto_falls_back_worker(ctx):
    """auto picks NCCL, whose setup then fails on rank 1: every rank goes on over
    IPC/IBGDA (here its CPU fallback), saying why, and stays exact; asked for by
    name, NCCL's failure raises on every rank instead."""
    from ep_checks import check_combine, combine_reference, make_inputs
    from mooncake.mooncake_elastic_buffer import ElasticBuffer
    from mooncake.mooncake_ep_buffer import FORCE_FALLBACK_ENV

    class Fake(_FakeNcclBuffer):
        def __init__(self, *args):
            super().__init__(*args, fail_on=(1,))

    # The Buffer it falls back to runs its CPU fallback (no GPU here).
    os.environ[FORCE_FALLBACK_ENV] = "1"

    _install_nccl_stand_in(ctx, Fake)
    world, rank, E = ctx.world_size, ctx.rank, 4
    eb = ElasticBuffer(dist.group.WORLD, 8, 256, 2, num_experts=E)
    assert eb.transport == "ibgda", (eb.transport, eb.transport_reason)
    assert eb.transport_reason.startswith(
        "auto chose NCCL, but its setup failed: the NCCL device-API transport could not be set "
        "up on ranks [1]"), eb.transport_reason
    x, idx, w = make_inputs(rank, 8, 256, E, 2, 5)
    act = torch.ones(world, dtype=torch.int32)
    recv, _, handle, _, _ = eb.dispatch(x, idx, act, 8, E, -1, use_fp8=False)
    out, _, _ = eb.combine(recv, idx, w, act, -1, handle)
    check_combine(out, combine_reference(rank, x, idx, w, [1] * world, E // world), False, "auto")
    eb.destroy()
    with pytest.raises(_ep_nccl.NcclSetupError, match=r"could not be set up on ranks \[1\]"):
        ElasticBuffer(dist.group.WORLD, 8, 256, 2, transport="nccl", num_experts=E)
    return "ok"


def test_auto_goes_on_without_nccl_when_its_setup_fails(backend):
    assert harness.run_ranks(_auto_falls_back_worker, 2, backend, timeout_s=120) == ["ok"] * 2


def _gin_contexts_worker(ctx):
    """With NCCL selected (the stand-in runtime), ranks whose NCCL_GIN_NCONTEXTS
    disagree all raise before any NCCL setup, and the group stays in step."""
    from mooncake.mooncake_elastic_buffer import ElasticBuffer

    _install_nccl_stand_in(ctx, _FakeNcclBuffer)
    with pytest.raises(ValueError) as err:
        ElasticBuffer(dist.group.WORLD, 8, 256, 2)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == ctx.world_size
    return str(err.value)


def test_ranks_that_disagree_on_nccl_gin_contexts_all_raise_before_nccl_setup(backend):
    env = "NCCL_GIN_NCONTEXTS"
    texts = harness.run_ranks(_gin_contexts_worker, 2, backend, timeout_s=120,
                              rank_env={0: {env: "4"}, 1: {env: "2"}})
    assert texts == [f"{env} differs across ranks or is not a count: [4, 2] (rank order); the "
                     f"NCCL transport needs one value (or none) on every rank"] * 2
    texts = harness.run_ranks(_gin_contexts_worker, 2, backend, timeout_s=120,
                              rank_env={1: {env: "many"}})
    assert all("['unset', 'not a count']" in t for t in texts), texts
