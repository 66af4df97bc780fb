"""ElasticBuffer on GPUs (skipped with the reason elsewhere).

One GPU (N processes sharing it, MPS recommended), mooncake-cpu control group,
EP data on the GPU:
  * auto -> IPC/IBGDA: NCCL refuses ranks that share a GPU, "nccl" raises;
  * dispatch/combine equal the Buffer reference bit for bit, and DeepEP's
    exact checks hold, for BF16/FP8 x sync/async/hook x one inactive rank;
  * update_ep_member() after a replacement through the PG elastic path;
  * stale handles and views rejected after an update.
Two or more GPUs with a USE_NCCL_DEVICE build: the NCCL transport
(`test_nccl_transport_two_gpus`), and the replacement through PG on a 1x2
topology, one process per GPU, with auto picking NCCL and with
MOONCAKE_EP_TRANSPORT=ibgda (the IPC path across the two GPUs).
"""

import pytest
import torch
import torch.distributed as dist

import harness
from ep_checks import SYNC_MODES, make_inputs, new_buffer, rows_by_source, run_round
from mooncake import _ep_runtime, _ep_transport
from mooncake.mooncake_elastic_buffer import ElasticBuffer
from mooncake.mooncake_ep_buffer import fp8_dequantize
from test_elastic_buffer import EPR, H, K, M, NO_NCCL, run_replacement

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or _ep_runtime.unavailable_reason("cuda") is not None,
    reason=f"needs a GPU and the compiled EP runtime: "
           f"{_ep_runtime.unavailable_reason('cuda') or 'torch.cuda.is_available() is False'}")


def _shared_gpu_worker(ctx):
    torch.cuda.set_device(0)
    world, rank = ctx.world_size, ctx.rank
    with pytest.raises(RuntimeError, match=r"transport 'nccl' was requested .*(" + NO_NCCL + ")"):
        ElasticBuffer(dist.group.WORLD, M, H, K, transport="nccl")
    eb = ElasticBuffer(dist.group.WORLD, M, H, K)
    assert eb.transport == "ibgda", eb.transport
    if world > 1:
        assert eb.transport_reason.startswith("ranks 0 and 1 share one CUDA device") or \
            "no NCCL device-API transport" in eb.transport_reason or \
            "the loaded libnccl is" in eb.transport_reason, eb.transport_reason
    E = EPR * world
    ref = new_buffer(dist.group.WORLD, M, H, world, E)
    diffs = []
    for seed, (use_fp8, mode, down) in enumerate(
            [(f, m, d) for f in (False, True) for m in SYNC_MODES for d in (False, True)]):
        active = [1] * world
        if down:
            active[world - 1] = 0
        diffs.append(run_round(ctx, eb, 500 + seed, use_fp8, mode, active, "cuda",
                               zero_copy=(seed % 2 == 0)))
        assert eb.use_fast_path, eb.fast_path_reason
        # Bit for bit against Buffer on the same inputs.
        x, idx, w = make_inputs(rank, M, H, E, K, 600 + seed)
        x, idx, w = x.cuda(), idx.cuda(), w.cuda()
        outs = []
        for buf in (eb, ref):
            act = torch.tensor(active, dtype=torch.int32, device="cuda")
            recv, count, handle, event, _ = buf.dispatch(x, idx, act, M, E, -1, use_fp8=use_fp8)
            event.current_stream_wait()
            expert_out = fp8_dequantize(*recv) if use_fp8 else recv
            out, event, _ = buf.combine(expert_out, idx, w, act, -1, handle)
            event.current_stream_wait()
            # Keyed by (source, token): a direct FP8 dispatch packs the
            # sources of an expert in arrival order, so only each source's
            # count in layout_range, not where its rows begin, is compared.
            rows = [rows_by_source(recv, handle, le, use_fp8) for le in range(count.numel())]
            rows = [sorted((key, data.view(torch.uint8), scales) for key, (data, scales) in r.items())
                    for r in rows]
            counts = handle[1].cpu() & 0xFFFFFFFF
            outs.append((rows, [count.cpu(), counts, out.cpu(), act.cpu()]))
        (rows_e, rest_e), (rows_b, rest_b) = outs
        for le, (re, rb) in enumerate(zip(rows_e, rows_b)):
            assert [k for k, _, _ in re] == [k for k, _, _ in rb], \
                f"seed {seed}: (source, token) rows of local expert {le} differ"
            for (key, de, se), (_, db, sb) in zip(re, rb):
                assert torch.equal(de, db) and (not use_fp8 or torch.equal(se, sb)), \
                    f"seed {seed}: row {key} of local expert {le}: ElasticBuffer != Buffer"
        for name, a, b in zip(("recv_count", "layout_range counts", "combined", "active_ranks"),
                              rest_e, rest_b):
            assert torch.equal(a, b), f"seed {seed}: {name}: ElasticBuffer != Buffer"
    # Views and handles do not survive update_ep_member().
    x, idx, w = make_inputs(rank, M, H, E, K, 700)
    x, idx, w = x.cuda(), idx.cuda(), w.cuda()
    act = torch.ones(world, dtype=torch.int32, device="cuda")
    recv, _, handle, event, _ = eb.dispatch(x, idx, act, M, E, -1, use_fp8=False)
    view = eb.get_next_combine_buffer(handle)
    eb.update_ep_member()
    with pytest.raises(ValueError, match=r"predates update_ep_member\(\)"):
        eb.combine(view, idx, w, act, -1, handle, zero_copy=True)
    recv2, _, handle2, event, _ = eb.dispatch(x, idx, act, M, E, -1, use_fp8=False)
    with pytest.raises(ValueError, match=r"x is a view returned by get_next_combine_buffer\(\) "
                                         r"before update_ep_member\(\)"):
        eb.combine(view, idx, w, act, -1, handle2, zero_copy=True)
    out, event, _ = eb.combine(recv2, idx, w, act, -1, handle2)
    event.current_stream_wait()
    eb.destroy()
    return max(diffs)


@needs_gpu
@pytest.mark.parametrize("world_size", [2, 4])
def test_one_gpu_auto_picks_ipc_and_matches_buffer(world_size):
    results = harness.run_ranks(_shared_gpu_worker, world_size, "mooncake-cpu", timeout_s=420)
    assert all(d < 9e-4 for d in results), results


@needs_gpu
def test_one_gpu_update_after_a_replacement_through_pg():
    run_replacement("cuda")


def _nccl_worker(ctx):
    torch.cuda.set_device(ctx.rank)
    eb = ElasticBuffer(dist.group.WORLD, M, H, K, transport="nccl")
    assert eb.transport == "nccl" and eb.topology == (1, ctx.world_size)
    diff = run_round(ctx, eb, 800, True, "sync", [1] * ctx.world_size, "cuda")
    eb.update_ep_member()
    diff = max(diff, run_round(ctx, eb, 801, False, "sync", [1] * ctx.world_size, "cuda"))
    eb.destroy()
    return diff


@pytest.mark.skipif(torch.cuda.device_count() < 2 or _ep_runtime.nccl_versions()[0] == 0,
                    reason="the NCCL device-API transport needs 2+ GPUs and a USE_NCCL_DEVICE=ON "
                           f"build (GPUs here: {torch.cuda.device_count()}, NCCL build version: "
                           f"{_ep_runtime.nccl_versions()[0]})")
def test_nccl_transport_two_gpus():
    results = harness.run_ranks(_nccl_worker, 2, "mooncake-cpu", timeout_s=420)
    assert all(d < 9e-4 for d in results), results


two_gpus_and_nccl = pytest.mark.skipif(
    torch.cuda.device_count() < 2 or _ep_runtime.nccl_versions()[0] == 0,
    reason="needs 2+ GPUs and a USE_NCCL_DEVICE=ON build (GPUs here: "
           f"{torch.cuda.device_count()}, NCCL build version: {_ep_runtime.nccl_versions()[0]})")


@two_gpus_and_nccl
@pytest.mark.parametrize("requested,expect", [(None, "nccl"), ("ibgda", "ibgda")])
def test_two_gpus_update_after_a_replacement_through_pg(requested, expect):
    """Slot 1 (GPU 1) is SIGKILLed after an exact round, the survivor takes it out, a
    replacement on GPU 1 joins and is recovered; every ElasticBuffer (before, after
    update_ep_member(), the replacement's) resolves to `expect`, rounds stay exact and
    the old handle is rejected."""
    env = {_ep_transport.TRANSPORT_ENV: requested} if requested else {}
    run_replacement("cuda", slots=2, gpus="per-rank", env=env, expect=expect)
