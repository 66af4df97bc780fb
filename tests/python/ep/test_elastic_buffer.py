"""ElasticBuffer over the IPC/IBGDA transport's fallback, multi-process, mooncake-cpu and gloo.

Every result is compared with a `Buffer` on the same inputs (bit for bit: the
same fallback runs) and with the independent references of ep_checks.py.
Recovery goes through the Mooncake PG elastic path: a rank is SIGKILLed, the
survivors' collective fails and PG deactivates it, a replacement joins its
slot (is_extension=True, join_group, recover_ranks), then survivors call
update_ep_member() while the replacement constructs an ElasticBuffer.
"""

import os
import re
import sys
import time

import pytest
import torch
import torch.distributed as dist

import harness
from ep_checks import (SYNC_MODES, check_combine, check_dispatch, combine_reference, make_inputs,
                       new_buffer, run_round)
from mooncake import _ep_transport
from mooncake.mooncake_ep_buffer import FORCE_FALLBACK_ENV, fp8_dequantize
from mooncake.mooncake_elastic_buffer import ElasticBuffer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pg"))
import elastic_checks as ec  # noqa: E402

FALLBACK_ENV = {FORCE_FALLBACK_ENV: "1"}
# Why NCCL is not used on a CPU machine, or with ranks sharing a GPU.
NO_NCCL = (r"no NCCL device-API transport|have no CUDA device|share one CUDA device|"
           r"the loaded libnccl is")
M, H, K, EPR = 8, 256, 4, 3  # max tokens, hidden, top-k, experts per rank


def _valid(recv, count, src_info):
    """The defined part of a dispatch's outputs (slots past recv_count are unspecified)."""
    parts = []
    for le, n in enumerate(count.tolist()):
        rows = recv if not isinstance(recv, tuple) else recv[0]
        parts.append(rows[le, :n].view(torch.uint8) if rows.dtype != torch.bfloat16
                     else rows[le, :n])
        if isinstance(recv, tuple):
            parts.append(recv[1][le, :n])
        parts.append(src_info[le, :n])
    return parts


def _parity_worker(ctx):
    world, rank = ctx.world_size, ctx.rank
    E = EPR * world
    eb = ElasticBuffer(dist.group.WORLD, M, H, K)
    # No NCCL here (no such build, no GPU, or ranks sharing one): IPC/IBGDA, and why.
    assert eb.transport == "ibgda", eb.transport
    assert re.search(NO_NCCL, eb.transport_reason), eb.transport_reason
    assert eb.num_experts is None and "not built yet" in eb.fast_path_reason
    ref = new_buffer(dist.group.WORLD, M, H, world, E)
    diffs = []
    for seed, (use_fp8, mode, down) in enumerate(
            [(f, m, d) for f in (False, True) for m in SYNC_MODES for d in (False, True)]):
        active = [1] * world
        if down:
            active[world - 1] = 0
        diffs.append(run_round(ctx, eb, 300 + seed, use_fp8, mode, active, "cpu"))
        # The same inputs through Buffer: identical bytes.
        x, idx, w = make_inputs(rank, M - rank % 2, H, E, K, 400 + seed)
        outs = []
        for buf in (eb, ref):
            act = torch.tensor(active, dtype=torch.int32)
            recv, count, handle, _, _ = buf.dispatch(x, idx, act, M, E, -1, use_fp8=use_fp8)
            data = fp8_dequantize(*recv) if use_fp8 else recv
            out, _, _ = buf.combine(data, idx, w, act, -1, handle)
            outs.append(_valid(recv, count, handle[0]) + [count, handle[1], out, act])
        same = all(torch.equal(a, b) for a, b in zip(*outs))
        assert same, f"seed {seed}: ElasticBuffer != Buffer"
    assert eb.num_experts == E
    # A handle from the reference Buffer is foreign here.
    x, idx, w = make_inputs(rank, M, H, E, K, 9)
    act = torch.ones(world, dtype=torch.int32)
    recv, _, handle, _, _ = ref.dispatch(x, idx, act, M, E, -1, use_fp8=False)
    with pytest.raises(ValueError, match="comes from another Buffer"):
        eb.combine(recv, idx, w, act, -1, handle)
    return max(diffs)


@pytest.mark.parametrize("world_size", [2, 4])
def test_elastic_buffer_equals_buffer(backend, world_size):
    results = harness.run_ranks(_parity_worker, world_size, backend, timeout_s=240,
                                env=FALLBACK_ENV)
    assert all(d < 1e-5 for d in results), results


def _checks_worker(ctx):
    world, rank = ctx.world_size, ctx.rank
    E = EPR * world
    eb = ElasticBuffer(None, M, H, K, num_experts=E)  # sized at construction
    assert eb.num_experts == E and eb.use_fast_path is False
    x, idx, w = make_inputs(rank, M, H, E, K, 1)
    act = torch.ones(world, dtype=torch.int32)
    bad = [
        (lambda: eb.dispatch(x, idx[:, :2].contiguous(), act, M, E, -1), ValueError,
         r"topk_idx has 2 columns; this ElasticBuffer was built for num_topk=4"),
        (lambda: eb.dispatch(x[:, :128].contiguous(), idx, act, M, E, -1), ValueError,
         r"x has hidden size 128; this ElasticBuffer was built for hidden=256"),
        (lambda: eb.dispatch(x, idx, act, M + 1, E, -1), ValueError,
         r"num_max_dispatch_tokens_per_rank=9 exceeds this ElasticBuffer's "
         r"num_max_tokens_per_rank=8"),
        (lambda: eb.dispatch(x, idx, act, M, 2 * E, -1), ValueError,
         rf"num_experts={2 * E}, but this ElasticBuffer's workspace was built for "
         rf"num_experts={E}"),
        # Buffer's own checks, unchanged:
        (lambda: eb.dispatch(x.float(), idx, act, M, E, -1), TypeError,
         r"x must be torch.bfloat16, got torch.float32"),
        (lambda: eb.dispatch(x, idx, act[:1], M, E, -1), ValueError,
         rf"active_ranks must have shape \[num_ranks={world}\]"),
        (lambda: eb.dispatch(x, idx, act, M, E, 0), ValueError, r"timeout_us must be -1"),
        (lambda: eb.dispatch(x, idx, act, M, E + 1, -1), ValueError,
         rf"num_experts={E + 1} must be divisible by the group size {world}"),
        (lambda: eb.combine(x, idx, w, act, -1, ("not", "a", "handle")), TypeError,
         r"handle must be the 6-tuple returned by Buffer.dispatch, got tuple of length 3"),
    ]
    for fn, exc, pattern in bad:
        with pytest.raises(exc, match=pattern):
            fn()
    assert act.tolist() == [1] * world
    # The buffer still works after every rejected call (none reached a collective).
    recv, _, handle, _, _ = eb.dispatch(x, idx, act, M, E, -1, use_fp8=False)
    with pytest.raises(TypeError, match=r"handle must be the 6-tuple"):
        eb.combine(recv, idx, w, act, -1, handle[:5])
    out, _, _ = eb.combine(recv, idx, w, act, -1, handle)
    diff = check_combine(out, combine_reference(rank, x, idx, w, [1] * world, EPR), False, "after")

    # destroy(): collective; afterwards every op names it; a second call is a no-op.
    eb.destroy()
    eb.destroy()
    for fn in (lambda: eb.dispatch(x, idx, act, M, E, -1),
               lambda: eb.combine(recv, idx, w, act, -1, handle),
               lambda: eb.get_next_combine_buffer(handle), eb.update_ep_member):
        with pytest.raises(RuntimeError, match=r"this ElasticBuffer was destroyed"):
            fn()
    # explicitly_destroy=True: destroy() is the way; forgetting it warns.
    eb2 = ElasticBuffer(dist.group.WORLD, M, H, K, explicitly_destroy=True)
    with pytest.warns(ResourceWarning, match="without destroy"):
        eb2.__del__()
    eb2.destroy()
    return diff


def test_argument_checks_and_destroy(backend):
    results = harness.run_ranks(_checks_worker, 2, backend, timeout_s=180, env=FALLBACK_ENV)
    assert all(d < 1e-5 for d in results), results


def test_constructor_checks_come_before_any_collective():
    # No process group at all: these must fail on the arguments alone.
    for kwargs, exc, pattern in [
        (dict(transport="ipc"), ValueError,
         r"transport must be one of 'auto', 'ibgda', 'nccl', got 'ipc'"),
        (dict(hidden=100), ValueError, r"hidden must be a multiple of 128, got 100"),
        (dict(num_topk=0), ValueError, r"num_topk must be >= 1, got 0"),
        (dict(explicitly_destroy=1), TypeError, r"explicitly_destroy must be a bool"),
    ]:
        args = dict(num_max_tokens_per_rank=M, hidden=H, num_topk=K)
        args.update(kwargs)
        with pytest.raises(exc, match=pattern):
            ElasticBuffer(object(), **args)


def _transport_worker(ctx, expect):
    world = ctx.world_size
    if expect == "nccl-error":
        with pytest.raises(RuntimeError, match=r"transport 'nccl' was requested \(argument\) but "
                           r"NCCL cannot be used: .*(" + NO_NCCL + ")"):
            ElasticBuffer(dist.group.WORLD, M, H, K, transport="nccl")
        # Every rank raised, so the group is still in step.
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == world
        return "ok"
    if expect == "bad-env":
        with pytest.raises(ValueError) as err:
            ElasticBuffer(dist.group.WORLD, M, H, K)
        text = str(err.value)
        assert text.startswith(f"ranks [1] have an invalid {_ep_transport.TRANSPORT_ENV}"), text
        assert ("(this rank: " in text) == (ctx.rank == 1), text
        assert text.endswith("expected one of 'auto', 'ibgda', 'nccl'"), text
        return "ok"
    if expect == "mixed":
        with pytest.raises(ValueError, match=r"the ranks ask for different EP transports"):
            ElasticBuffer(dist.group.WORLD, M, H, K)
        return "ok"
    eb = ElasticBuffer(dist.group.WORLD, M, H, K)
    assert eb.transport == "ibgda"
    return eb.transport_reason


def test_transport_selection_over_a_group(backend):
    harness.run_ranks(_transport_worker, 2, backend, timeout_s=120, args=("nccl-error",))
    reasons = harness.run_ranks(_transport_worker, 2, backend, timeout_s=120, args=("env",),
                                env={_ep_transport.TRANSPORT_ENV: "ibgda"})
    assert reasons == [f"transport 'ibgda' was requested ({_ep_transport.TRANSPORT_ENV})"] * 2
    harness.run_ranks(_transport_worker, 2, backend, timeout_s=120, args=("mixed",),
                      rank_env={1: {_ep_transport.TRANSPORT_ENV: "ibgda"}})
    # A bad value on one rank: every rank raises (none is left in the exchange).
    harness.run_ranks(_transport_worker, 2, backend, timeout_s=120, args=("bad-env",),
                      rank_env={1: {_ep_transport.TRANSPORT_ENV: "rdma"}})


def _update_worker(ctx):
    """update_ep_member with every rank healthy (no replacement)."""
    world, rank = ctx.world_size, ctx.rank
    E = EPR * world
    eb = ElasticBuffer(dist.group.WORLD, M, H, K)
    x, idx, w = make_inputs(rank, M, H, E, K, 21)
    act = torch.ones(world, dtype=torch.int32)
    recv, _, old, _, _ = eb.dispatch(x, idx, act, M, E, -1, use_fp8=False)
    eb.update_ep_member()
    assert eb.generation == 1 and eb.num_experts == E
    with pytest.raises(ValueError, match=r"predates update_ep_member\(\) of this ElasticBuffer "
                                         r"\(now generation 1\)"):
        eb.combine(recv, idx, w, act, -1, old)
    return run_round(ctx, eb, 22, True, "sync", [1] * world, "cpu", top_k=K)


def test_update_ep_member_rejects_old_handles(backend):
    results = harness.run_ranks(_update_worker, 3, backend, timeout_s=180, env=FALLBACK_ENV)
    assert all(d < 1e-5 for d in results), results


# ---------------------------------------------------------------- replacement through PG

# With `slots` ranks, the last slot's process is the victim and process `slots`
# its replacement, which takes the victim's slot.
SEED = 31


def _round(eb, slot, world, seed, label, device="cpu"):
    """One exact dispatch/combine round without a reference group (inputs are rebuilt)."""
    E = EPR * world
    x, idx, w = make_inputs(slot, M, H, E, K, seed)
    all_topk = torch.stack([make_inputs(r, M, H, E, K, seed)[1] for r in range(world)])
    xd, idxd, wd = x.to(device), idx.to(device), w.to(device)
    act = torch.ones(world, dtype=torch.int32, device=device)
    recv, count, handle, event, _ = eb.dispatch(xd, idxd, act, M, E, 30_000_000, use_fp8=False)
    event.current_stream_wait()
    data = check_dispatch(slot, world, recv.cpu(), count.cpu(), (handle[0].cpu(), handle[1].cpu()),
                          all_topk, [1] * world, E, M, H, False, label)
    out, event, _ = eb.combine(data.to(device), idxd, wd, act, 30_000_000, handle)
    event.current_stream_wait()
    check_combine(out.cpu(), combine_reference(slot, x, idx, w, [1] * world, EPR), False, label)
    return recv, idxd, wd, act, handle


def _replace_job(ctx, device="cpu", slots=3, gpus="shared", expect="ibgda"):
    victim, replacement = slots - 1, slots
    proc = ctx.rank
    slot = victim if proc == replacement else proc
    survivors = list(range(slots - 1))
    if device == "cuda":
        # shared: every process on the one GPU (cuda_ipc, never NCCL); per-rank:
        # slot s on GPU s, the replacement on the victim's.
        torch.cuda.set_device(slot if gpus == "per-rank" else 0)
        # The context now, not inside the fast path's setup, whose collectives
        # run under ELASTIC_ENV's 3 s timeout.
        torch.ones(1, device="cuda").sum().item()
    checks = ec.Checks(ctx)
    state = {}

    def body():
        P = ec.pg()
        if proc != replacement:
            with checks.step("founders: init, ElasticBuffer, one exact round"):
                ec.init(ctx, slot, slots, ec.options(slots))
                eb = ElasticBuffer(dist.group.WORLD, M, H, K)
                assert eb.transport == expect, (eb.transport, eb.transport_reason)
                state["old"] = _round(eb, slot, slots, SEED, "before the failure", device)
                assert eb.use_fast_path == (device == "cuda"), eb.fast_path_reason
            if proc == victim:
                ec.wait_all(ctx, "round0_done", survivors)
                ctx.kill_self()
            ctx.signal(f"round0_done_{slot}")
            with checks.step(f"survivors: the failed collective deactivates slot {victim}"):
                deadline = time.monotonic() + ec.STEP_S
                while ec.mask() != [1] * (slots - 1) + [0]:
                    try:
                        dist.all_reduce(torch.ones(4))
                    except Exception:  # noqa: BLE001 - the failure is what we wait for
                        pass
                    assert time.monotonic() < deadline, f"mask {ec.mask()} after {ec.STEP_S} s"
            if slot == 0:
                ctx.signal("launch_replacement")
                with checks.step(f"rank 0: recover_ranks([{victim}]) once the replacement is ready"):
                    ec.wait_event(ctx, "replacement_joining")
                    ec.wait_peers_ready(ctx, [victim])
                    P.recover_ranks(dist.group.WORLD, [victim])
            with checks.step(f"survivors: slot {victim} active again"):
                ec.wait_mask(ctx, [1] * slots)
            with checks.step("survivors: update_ep_member"):
                eb.update_ep_member()
                assert eb.generation == 1 and eb.num_experts == EPR * slots
                assert eb.transport == expect, (eb.transport, eb.transport_reason)
            with checks.step("survivors: the handle from before is rejected"):
                recv, idx, w, act, handle = state["old"]
                try:
                    eb.combine(recv, idx, w, act, -1, handle)
                except ValueError as e:
                    assert "predates update_ep_member()" in str(e), str(e)
                else:
                    raise AssertionError("a handle from before update_ep_member() was accepted")
        else:
            with checks.step(f"replacement: init slot {victim} with is_extension=True, join_group"):
                ec.init(ctx, victim, slots, ec.options(slots, True))
                ctx.signal("replacement_joining")
                ec.join_group(dist.group.WORLD, timeout_s=ec.STEP_S)
            with checks.step("replacement: ElasticBuffer with the same arguments"):
                eb = ElasticBuffer(dist.group.WORLD, M, H, K)
                # It learns num_experts from the survivors' workspace.
                assert eb.num_experts == EPR * slots and eb.generation == 0
                assert eb.transport == expect, (eb.transport, eb.transport_reason)
        with checks.step("all: an exact round after the recovery"):
            _round(eb, slot, slots, SEED + 1, "after the recovery", device)
            assert eb.use_fast_path == (device == "cuda"), eb.fast_path_reason
        with checks.step("all: destroy"):
            eb.destroy()

    def final():
        if proc == 0:
            if not ctx.signalled("launch_replacement"):
                ctx.signal("launch_replacement")
            ec.last_out(ctx, [p for p in range(1, slots + 1) if p != victim])
        else:
            ec.leave(ctx, checks)

    return ec.run_guarded(checks, body, final)


def run_replacement(device="cpu", slots=3, gpus="shared", env=None, expect="ibgda"):
    """The replacement job over `slots` ranks; asserts every check of every process.

    `env` is added to every process's environment; `expect` is the transport every
    ElasticBuffer must resolve to (before the failure, after update_ep_member(), and
    the replacement's)."""
    err = harness.backend_import_error("mooncake-cpu")
    if err is not None:
        pytest.fail(f"mooncake-cpu is not available: {err}", pytrace=False)
    victim, replacement = slots - 1, slots
    env = dict(ec.ELASTIC_ENV, **(FALLBACK_ENV if device == "cpu" else {}), **(env or {}))
    res = harness.run_ranks(_replace_job, slots + 1, "mooncake-cpu", timeout_s=240, env=env,
                            init=False, ref_group=False, expect_killed=[victim],
                            args=(device, slots, gpus, expect),
                            late={replacement: "launch_replacement"})
    failures = []
    for proc in [p for p in range(slots + 1) if p != victim]:
        assert isinstance(res[proc], dict), f"process {proc}: {res[proc]}"
        failures += [f"proc {proc}: [{name}] {err}" for name, err in res[proc]["checks"].items()
                     if err is not None]
        assert "all: an exact round after the recovery" in res[proc]["checks"], res[proc]
    assert not failures, "\n".join(failures)


def test_update_ep_member_after_a_replacement_through_pg():
    run_replacement("cpu")


def test_update_ep_member_after_a_replacement_in_a_pair():
    """Two slots: the one survivor takes the victim out and recovers the slot alone
    (the 1x2 shape the two-GPU run uses, here on the CPU fallback)."""
    run_replacement("cpu", slots=2)
