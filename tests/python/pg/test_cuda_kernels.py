"""The `mooncake` backend's device-kernel path on CUDA tensors (MC_PG_CUDA_PATH=kernels),
N processes sharing one GPU: kernel calls queued back to back, a mismatch among queued
calls, reduce and the list forms (gather, scatter, all_to_all with tensor lists) on
the kernels with root and size mismatches failing every rank, the direct path
(all_to_all with split sizes, the agreement exchange skipped for repeated buffers),
and the coalesced forms. Skipped, with the reason shown, on a machine without a GPU.
"""

import pytest
import torch
import torch.distributed as dist

import harness
from cuda_common import (BACKEND, JOB_TIMEOUT_S, OP_TIMEOUT_S, PATHS, _agreements_skipped,
                         _device_calls, _direct_calls, use_rank_gpu, world_sizes)

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine: the `mooncake` CUDA tests need a GPU",
                allow_module_level=True)


PIPELINE_OPS = 200


def _pipelined(ctx):
    """Async kernel calls queued back to back, each on its own tensor: the values
    are exact, every Work succeeds, and wait() only ordered the stream."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    failures = []
    calls_before = _device_calls()
    ts = [torch.full((1000,), float(rank + 1 + i), device=dev) for i in range(PIPELINE_OPS)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    got = torch.stack(ts).cpu()  # on the current stream, after every wait()
    want = torch.stack([torch.full((1000,), float(sum(r + 1 + i for r in range(ws))))
                        for i in range(PIPELINE_OPS)])
    if not torch.equal(got, want):
        bad = [i for i in range(PIPELINE_OPS) if not torch.equal(got[i], want[i])]
        failures.append(f"rank {rank}: calls {bad[:10]} (of {len(bad)}) hold wrong sums, "
                        f"first {got[bad[0]][:3].tolist()} vs {want[bad[0]][:3].tolist()}")
    for i, w in enumerate(works):
        w.synchronize()
        if not (w.is_completed() and w.is_success()):
            failures.append(f"rank {rank}: call {i} completed={w.is_completed()} "
                            f"success={w.is_success()}")
    calls = _device_calls() - calls_before
    if calls != PIPELINE_OPS:
        failures.append(f"rank {rank}: {calls} device calls for {PIPELINE_OPS} all_reduces")
    return failures


@pytest.mark.parametrize("world_size", world_sizes(2, 3))
def test_kernel_calls_queued_back_to_back(world_size):
    res = harness.run_ranks(_pipelined, world_size, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    failures = [f for per_rank in res for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _mismatch_among_queued_calls(ctx):
    """Four async all_reduces queued back to back; in the second, rank 0 passes 16
    more elements than the others. That call fails on every rank, naming the
    mismatch, once synchronize() has it; the calls around it keep exact values."""
    dev = use_rank_gpu(ctx.rank)
    rank = ctx.rank
    counts = [256, 256 + (16 if rank == 0 else 0), 256, 256]
    ts = [torch.full((n,), float(rank + 1 + i), device=dev) for i, n in enumerate(counts)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    out = []
    for i, w in enumerate(works):
        try:
            w.wait()
            w.synchronize()
            out.append({"ok": True, "values": sorted(set(ts[i].cpu().tolist()))})
        except Exception as e:  # noqa: BLE001 - the failure is the result
            out.append({"ok": False, "type": type(e).__name__, "message": str(e)[:600],
                        "success": w.is_success()})
    return out


def test_mismatch_among_queued_kernel_calls_fails_that_call_only():
    ws = 2
    res = harness.run_ranks(_mismatch_among_queued_calls, ws, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, calls in enumerate(res):
        for i in (0, 2, 3):
            want = float(sum(r + 1 + i for r in range(ws)))
            assert calls[i] == {"ok": True, "values": [want]}, (rank, i, calls[i])
        bad = calls[1]
        assert bad["ok"] is False and bad["success"] is False, (rank, bad)
        assert bad["type"] == "DistBackendError", (rank, bad)
        assert "mismatch" in bad["message"], (rank, bad)


def _failure_then_group(op, rank, dev):
    """Runs op() (an async collective expected to fail on every rank), waits
    and synchronizes it; returns its failure as "Type: message" (None if it
    succeeded) and the values of an all_reduce after it (the group goes on)."""
    try:
        work = op()
        work.wait()
        work.synchronize()
        failure = None
    except Exception as e:  # noqa: BLE001 - the failure is the result
        failure = f"{type(e).__name__}: {str(e)[:600]}"
    z = torch.full((64,), float(rank + 1), device=dev)
    dist.all_reduce(z)
    return failure, sorted(set(z.cpu().tolist()))


def _reduce_on_kernels(ctx):
    """reduce runs on the device kernels (an all_reduce signed with its root):
    exact at the root, the other ranks' tensors untouched, through the window
    (8 KiB) and the direct path (8 MiB). Ranks that disagree on the root fail
    that call on every rank, naming the mismatch; the group goes on."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    out = {"failures": []}
    before, direct_before = _device_calls(), _direct_calls()
    for n in (2048, 2 << 20):
        for root in range(ws):
            t = torch.arange(n, dtype=torch.float32, device=dev) % 97 + rank
            dist.reduce(t, dst=root)
            base = torch.arange(n, dtype=torch.float32) % 97
            want = base * ws + sum(range(ws)) if rank == root else base + rank
            if not torch.equal(t.cpu(), want):
                out["failures"].append(f"rank {rank}: reduce of {n} floats to {root} differs")
    out["device_calls"] = _device_calls() - before
    out["direct_calls"] = _direct_calls() - direct_before
    x = torch.ones(64, device=dev)
    out["mismatch"], out["after"] = _failure_then_group(
        lambda: dist.reduce(x, dst=0 if rank == 0 else 1, async_op=True), rank, dev)
    return out


def test_reduce_runs_on_the_kernels_and_a_root_mismatch_fails_every_rank():
    ws = 3
    res = harness.run_ranks(_reduce_on_kernels, ws, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"])
        assert r["device_calls"] == 2 * ws, (rank, r)
        assert r["direct_calls"] == ws, (rank, r)
        assert r["mismatch"] and r["mismatch"].startswith("DistBackendError"), (rank, r)
        assert "passed reduce to root" in r["mismatch"], (rank, r)
        assert r["after"] == [float(sum(range(1, ws + 1)))], (rank, r)


def _repeated_direct(ctx):
    """The same 16 MiB tensor all_reduced four times, then a new one twice:
    every call exact on the direct path; the agreement exchange runs the
    first time a set of buffers is seen and is skipped after (3 + 1 times)."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    failures = []
    direct_before, skipped_before = _direct_calls(), _agreements_skipped()
    t = torch.empty(4 << 20, device=dev)
    u = torch.empty(4 << 20, device=dev)
    for name, buf, iters in (("t", t, 4), ("u", u, 2)):
        for it in range(iters):
            buf.fill_(float(rank + it))
            dist.all_reduce(buf)
            want = float(sum(range(ws)) + ws * it)
            if not bool((buf == want).all()):
                failures.append(f"rank {rank}: all_reduce {it} of {name} is not {want}")
    return {"failures": failures, "direct": _direct_calls() - direct_before,
            "skipped": _agreements_skipped() - skipped_before}


@pytest.mark.parametrize("ws", [2, 3])
def test_repeated_direct_calls_skip_the_agreement_exchange(ws):
    res = harness.run_ranks(_repeated_direct, ws, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"])
        assert r["direct"] == 6 and r["skipped"] == 4, (rank, r)


def _uneven_all_to_all(ctx):
    """all_to_all_single with split sizes on CUDA tensors: rank s sends rank r
    (s + 1) * (r + 2) rows of 3 (none when r == s + 1), each row naming its
    sender, receiver and index; exact on every rank through the direct path.
    Then rank 0 claims one row more from rank 1 than rank 1 sends: the call
    fails on every rank naming the pair, and the group goes on."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    rows = lambda s, r: 0 if r == s + 1 else (s + 1) * (r + 2)  # noqa: E731
    out = {"failures": []}
    before = _direct_calls()
    for _ in range(2):
        send = [rows(rank, r) for r in range(ws)]
        recv = [rows(s, rank) for s in range(ws)]
        inp = torch.cat([torch.tensor([[rank, r, i] for i in range(send[r])], dtype=torch.float32)
                         .reshape(-1, 3) for r in range(ws)]).to(dev)
        got = torch.full((sum(recv), 3), -1.0, device=dev)
        dist.all_to_all_single(got, inp, recv, send)
        want = torch.cat([torch.tensor([[s, rank, i] for i in range(recv[s])], dtype=torch.float32)
                          .reshape(-1, 3) for s in range(ws)])
        if not torch.equal(got.cpu(), want):
            out["failures"].append(f"rank {rank}: uneven all_to_all_single differs")
    out["direct_calls"] = _direct_calls() - before
    send = [2] * ws
    recv = [2] * ws
    if rank == 0:
        recv[1] = 3
    x = torch.ones(2 * ws, device=dev)
    y = torch.zeros(sum(recv), device=dev)
    out["mismatch"], out["after"] = _failure_then_group(
        lambda: dist.all_to_all_single(y, x, recv, send, async_op=True), rank, dev)
    return out


def test_all_to_all_with_split_sizes_runs_direct_and_a_size_mismatch_fails_every_rank():
    ws = 3
    res = harness.run_ranks(_uneven_all_to_all, ws, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"])
        assert r["direct_calls"] == 2, (rank, r)
        assert r["mismatch"] and "rank 1 sends 8 bytes to rank 0, which expects 12 bytes" in \
            r["mismatch"], (rank, r)
        assert r["after"] == [float(sum(range(1, ws + 1)))], (rank, r)


def _split_then_plain_all_to_all(ctx):
    """Two ranks whose buffers differ in size (rank 0: 8 MiB in and out, rank 1:
    6 MiB) run a valid all_to_all_single with split sizes on the direct path,
    then pass the same tensors to a plain all_to_all_single, whose counts then
    disagree. The same buffers offered under the other bounds rule must not
    carry the first call's agreement over: every rank fails the second call
    naming the mismatch, and the group goes on."""
    dev = use_rank_gpu(ctx.rank)
    rank = ctx.rank
    c, own = 1 << 20, (1 << 20) if rank == 0 else (1 << 19)  # floats to the peer, to itself
    inp = torch.empty(own + c, device=dev)  # first: a segment of their own
    out = torch.empty(own + c, device=dev)
    inp.copy_(torch.arange(own + c, dtype=torch.float32) % 1021 + 10000 * rank)
    in_splits = [own, c] if rank == 0 else [c, own]
    res = {"failures": []}
    direct_before, skipped_before = _direct_calls(), _agreements_skipped()
    dist.all_to_all_single(out, inp, in_splits, in_splits)
    base = torch.arange(2 << 20, dtype=torch.float32) % 1021
    if rank == 0:  # its own first `own`, then rank 1's first c
        want = torch.cat([base[:own], base[:c] + 10000])
    else:  # rank 0's elements [1M, 2M), then its own [c, c + own)
        want = torch.cat([base[1 << 20:(1 << 20) + c], base[c:c + own] + 10000])
    if not torch.equal(out.cpu(), want):
        res["failures"].append(f"rank {rank}: the split all_to_all_single differs")
    res["direct"] = _direct_calls() - direct_before
    res["mismatch"], res["after"] = _failure_then_group(
        lambda: dist.all_to_all_single(out, inp, async_op=True), rank, dev)
    res["skipped"] = _agreements_skipped() - skipped_before
    return res


def test_a_plain_all_to_all_on_buffers_agreed_for_split_sizes_fails_alike_everywhere():
    res = harness.run_ranks(_split_then_plain_all_to_all, 2, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"])
        assert r["direct"] == 1 and r["skipped"] == 0, (rank, r)
        assert r["mismatch"] and r["mismatch"].startswith("DistBackendError"), (rank, r)
        assert "passed all_to_all" in r["mismatch"], (rank, r)
        assert r["after"] == [3.0], (rank, r)


def _list_all_to_all(ctx):
    """all_to_all with tensor lists, a different size per (source, destination)
    pair and one pair empty, runs on the direct kernels (one call each):
    exact at about 1 KiB and 1 MiB per block, into strided views of one
    buffer whose other columns stay untouched."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    failures = []
    before = _direct_calls()
    calls = 0

    def size(src, dst, scale):
        return 0 if (src, dst) == (1, 2) else scale * (1 + src + 2 * dst)

    def value(src, dst, n):  # exact in float32
        return (torch.arange(n, dtype=torch.float32) % 251) + 1000 * src + 7 * dst

    for scale in (37, 37 << 10):
        ins = [value(rank, p, size(rank, p, scale)).to(dev) for p in range(ws)]
        rows = max(size(p, rank, scale) for p in range(ws))
        big = torch.full((rows, 2 * ws), -1.0, device=dev)
        outs = [big[:size(p, rank, scale), 2 * p] for p in range(ws)]
        dist.all_to_all(outs, ins)
        calls += 1
        for p in range(ws):
            want = value(p, rank, size(p, rank, scale))
            if not torch.equal(outs[p].cpu(), want):
                failures.append(f"rank {rank} scale {scale} from {p}: got "
                                f"{outs[p].flatten()[:4].tolist()}, want {want[:4].tolist()}")
        if not torch.equal(big[:, 1::2].cpu(), torch.full((rows, ws), -1.0)):
            failures.append(f"rank {rank} scale {scale}: the odd columns were written")
    return {"failures": failures, "direct_calls": _direct_calls() - before, "calls": calls}


def test_all_to_all_with_tensor_lists_runs_on_the_direct_kernels():
    res = harness.run_ranks(_list_all_to_all, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"])
        assert r["direct_calls"] == r["calls"], (rank, r)


def _lists_on_kernels(ctx):
    """all_gather and reduce_scatter with tensor lists, gather and scatter run
    on the device kernels (one call each): exact for every root, 3 KiB and
    3 MiB (the window path, messages many slots long), non-contiguous list
    tensors included, a gather's non-roots and their tensors untouched. Ranks
    that disagree on a gather's root fail that call on every rank, naming it;
    the group goes on."""
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    out = {"failures": []}
    before = _device_calls()
    calls = 0

    def check(what, got, want):
        if not torch.equal(got.cpu(), want):
            out["failures"].append(f"{what}: got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")

    def value(src, dst, n):  # what rank src holds for rank dst: exact in float32
        return (torch.arange(n, dtype=torch.float32) % 251) + 1000 * src + 7 * dst

    for n in (768, 768 << 10):
        mine = value(rank, 0, n).to(dev)
        # all_gather into a list whose tensors are strided views of one buffer
        big = torch.full((n, 2 * ws), -1.0, device=dev)
        outs = [big[:, 2 * r] for r in range(ws)]
        dist.all_gather(outs, mine)
        calls += 1
        for r in range(ws):
            check(f"all_gather {n} [{r}]", outs[r], value(r, 0, n))
        check(f"all_gather {n} odd columns untouched", big[:, 1::2].cpu(), torch.full((n, ws), -1.0))
        got = torch.zeros(n, device=dev)
        dist.reduce_scatter(got, [value(rank, p, n).to(dev) for p in range(ws)])
        calls += 1
        check(f"reduce_scatter {n}", got, sum(value(s, rank, n) for s in range(ws)))
        for root in range(ws):
            gl = [torch.full((n,), -2.0, device=dev) for _ in range(ws)] if rank == root else None
            dist.gather(mine, gather_list=gl, dst=root)
            calls += 1
            if rank == root:
                for r in range(ws):
                    check(f"gather {n} root {root} [{r}]", gl[r], value(r, 0, n))
            check(f"gather {n} root {root}: input untouched", mine, value(rank, 0, n))
            sl = [value(root, p, n).to(dev) for p in range(ws)] if rank == root else None
            got = torch.full((n,), -3.0, device=dev)
            dist.scatter(got, scatter_list=sl, src=root)
            calls += 1
            check(f"scatter {n} root {root}", got, value(root, rank, n))
    out["device_calls"] = _device_calls() - before
    out["expected_calls"] = calls
    x = torch.ones(64, device=dev)
    gl = [torch.zeros(64, device=dev) for _ in range(ws)] if rank in (0, 1) else None
    out["mismatch"], out["after"] = _failure_then_group(
        lambda: dist.gather(x, gather_list=gl, dst=0 if rank == 0 else 1, async_op=True), rank, dev)
    return out


def test_list_forms_gather_and_scatter_run_on_the_kernels_and_a_root_mismatch_fails_every_rank():
    ws = 3
    res = harness.run_ranks(_lists_on_kernels, ws, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS["kernels"], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, r["failures"][:10])
        assert r["device_calls"] == r["expected_calls"], (rank, r)
        assert r["mismatch"] and r["mismatch"].startswith("DistBackendError"), (rank, r)
        assert "passed gather of dtype float32, root" in r["mismatch"], (rank, r)
        assert r["after"] == [float(sum(range(1, ws + 1)))], (rank, r)


def _coalesced_forms(ctx):
    """all_reduce, all_gather_into_tensor and reduce_scatter_tensor coalesced
    (torch's _coalescing_manager fast path, sync and async, and the deprecated
    all_reduce_coalesced and all_gather_coalesced), two tensors each, at 3 KiB
    and 3 MiB: exact; on the kernels path one device call per tensor."""
    import warnings
    dev = use_rank_gpu(ctx.rank)
    ws, rank = ctx.world_size, ctx.rank
    out = {"failures": []}
    before = _device_calls()
    calls = 0

    def check(what, got, want):
        if not torch.equal(got.cpu(), want.cpu()):
            out["failures"].append(f"{what}: got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")

    def value(src, n, dtype):  # exact in both dtypes: small integers
        return ((torch.arange(n) % 13) + 3 * src + 1).to(dtype)

    total = lambda n, dtype: sum(value(s, n, dtype) for s in range(ws))  # noqa: E731
    for n in (768, 768 << 10):
        for async_ops in (False, True):
            a, b = value(rank, n, torch.float32).to(dev), value(rank, n, torch.int32).to(dev)
            with dist._coalescing_manager(async_ops=async_ops) as cm:
                dist.all_reduce(a)
                dist.all_reduce(b)
            if async_ops:
                cm.wait()
            calls += 2
            check(f"coalesced all_reduce {n} async={async_ops} float32", a, total(n, torch.float32))
            check(f"coalesced all_reduce {n} async={async_ops} int32", b, total(n, torch.int32))
        ins = [value(rank, n, torch.float32).to(dev), value(rank, 2 * n, torch.int32).to(dev)]
        outs = [torch.full((ws * n,), -1.0, device=dev), torch.full((ws * 2 * n,), -1, dtype=torch.int32, device=dev)]
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        calls += 2
        check(f"coalesced all_gather_into_tensor {n} [0]", outs[0], torch.cat([value(r, n, torch.float32) for r in range(ws)]))
        check(f"coalesced all_gather_into_tensor {n} [1]", outs[1], torch.cat([value(r, 2 * n, torch.int32) for r in range(ws)]))
        full = [value(rank, ws * n, torch.float32).to(dev), value(rank, ws * n, torch.int32).to(dev)]
        got = [torch.zeros(n, device=dev), torch.zeros(n, dtype=torch.int32, device=dev)]
        with dist._coalescing_manager():
            for g, f in zip(got, full):
                dist.reduce_scatter_tensor(g, f)
        calls += 2
        for k, dtype in enumerate((torch.float32, torch.int32)):
            want = total(ws * n, dtype)[rank * n:(rank + 1) * n]
            check(f"coalesced reduce_scatter_tensor {n} [{k}]", got[k], want)
        # torch's all_reduce_coalesced takes one dtype
        x, y = value(rank, n, torch.float32).to(dev), value(rank, 2 * n, torch.float32).to(dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated in torch, still served
            dist.all_reduce_coalesced([x, y])
        calls += 2
        check(f"all_reduce_coalesced {n} [0]", x, total(n, torch.float32))
        check(f"all_reduce_coalesced {n} [1]", y, total(2 * n, torch.float32))
        # all_gather_coalesced: output_tensor_lists[r][i] is rank r's input i;
        # async at the larger size, through the Future it returns
        ins = [value(rank, n, torch.float32).to(dev), value(rank, 2 * n, torch.float32).to(dev)]
        lists = [[torch.full((n,), -1.0, device=dev), torch.full((2 * n,), -1.0, device=dev)]
                 for _ in range(ws)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated in torch, still served
            fut = dist.all_gather_coalesced(lists, ins, async_op=n > 1000)
        if fut is not None:
            fut.wait()
        calls += 2
        for r in range(ws):
            check(f"all_gather_coalesced {n} [{r}][0]", lists[r][0], value(r, n, torch.float32))
            check(f"all_gather_coalesced {n} [{r}][1]", lists[r][1], value(r, 2 * n, torch.float32))
    out["device_calls"] = _device_calls() - before
    out["expected_calls"] = calls
    return out


@pytest.mark.parametrize("path", ["kernels", "staged"])
def test_coalesced_forms_are_exact_and_run_one_kernel_call_per_tensor(path):
    res = harness.run_ranks(_coalesced_forms, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            ref_group=False, env=PATHS[path], pg_timeout_s=OP_TIMEOUT_S)
    for rank, r in enumerate(res):
        assert not r["failures"], (rank, path, r["failures"][:10])
        want = r["expected_calls"] if path == "kernels" else 0
        assert r["device_calls"] == want, (rank, path, r)


# A stalled rank's peers wait this long (the group's timeout) before their op
# fails; kept short so the test spends seconds, not minutes, on it.
