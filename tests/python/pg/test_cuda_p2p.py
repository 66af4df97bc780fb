"""P2P on CUDA tensors with the `mooncake` backend: N processes sharing one GPU.

On the kernel path (MC_PG_CUDA_PATH=kernels, the default) sends and recvs of
CUDA tensors move over device pools (docs/design/pg-cuda.md): the copy engine
copies a send's chunks from the user's tensor into the pool its receiver
keeps for the sender, and out of it into the receiver's tensor. These tests
check the values against Python references (messages larger than a pool,
strided tensors, batches, any-source recvs, every rank sending before any
receives), that the ops took that path (or, staged, did not), the stream
order around them (synchronize(), a consumer queued after wait()), and a
SIGKILLed peer during a pending CUDA recv. The stream-order tests of
test_cuda.py (a slow producer before isend, a slow kernel before irecv) run
on the same path. Skipped, with the reason shown, on a machine without a GPU.
"""

import time

import pytest
import torch
import torch.distributed as dist

import harness

if not torch.cuda.is_available():
    pytest.skip("no CUDA device on this machine: the `mooncake` CUDA tests need a GPU",
                allow_module_level=True)

from cuda_common import BACKEND, JOB_TIMEOUT_S, PATHS, use_rank_gpu

# A pool of 1 MiB per sender (chunks of 1 MiB): a 9 MiB message crosses it
# nine times, and the default 16 MiB pools are covered by the kernels path.
SMALL_POOLS = {"MC_PG_CUDA_PATH": "kernels", "MC_PG_CUDA_P2P_POOL_BYTES": str(1 << 20)}
# The same through the copy kernel (MC_PG_CUDA_P2P_COPY=kernel): odd sizes
# take its byte tail, the rest its 16-byte words.
COPY_KERNEL = {**SMALL_POOLS, "MC_PG_CUDA_P2P_COPY": "kernel"}
P2P_PATHS = {"staged": PATHS["staged"], "kernels": PATHS["kernels"],
             "kernels-small-pools": SMALL_POOLS, "kernels-copy-kernel": COPY_KERNEL}


def _device_p2p_ops():
    from mooncake import pg
    return int(pg._lib._device_p2p_ops(dist.group.WORLD))


def _payload(src, dst, numel, dtype, device, salt=0):
    """What rank `src` sends to `dst`: distinct per pair, exact in every dtype."""
    base = torch.arange(numel, dtype=torch.int64, device=device)
    return ((base * 7 + src * 31 + dst * 11 + salt) % 101).to(dtype)


def _values(ctx):
    dev = use_rank_gpu(ctx.rank)
    rank, ws = ctx.rank, ctx.world_size
    right, left = (rank + 1) % ws, (rank - 1) % ws
    failures = []

    def eq(what, got, want):
        if not torch.equal(got.cpu(), want.cpu()):
            bad = int((got.cpu() != want.cpu()).sum()) if got.shape == want.shape else -1
            failures.append(f"rank {rank}: {what}: {bad} elements differ")

    # A ring of messages from empty to 9 MiB (several pools), in several dtypes.
    for numel, dtype in ((0, torch.float32), (1, torch.float32), (4097, torch.bfloat16),
                         ((9 << 20) // 4, torch.float32), (3 << 20, torch.int8)):
        got = torch.full((numel,), -1, dtype=dtype, device=dev)
        reqs = [dist.isend(_payload(rank, right, numel, dtype, dev), right),
                dist.irecv(got, left)]
        for r in reqs:
            r.wait()
        eq(f"ring of {numel} x {dtype}", got, _payload(left, rank, numel, dtype, dev))

    # Every rank sends to every other before it receives: the sends wait for
    # their receivers' credits without blocking the recvs posted after them.
    n = 300_000
    sends = [dist.isend(_payload(rank, p, n, torch.float32, dev, salt=1), p)
             for p in range(ws) if p != rank]
    for p in range(ws):
        if p != rank:
            got = torch.empty(n, device=dev)
            dist.recv(got, p)
            eq(f"all-to-all recv from {p}", got, _payload(p, rank, n, torch.float32, dev, 1))
    for s in sends:
        s.wait()

    # Strided tensors on both sides: a transposed send, a column of a recv.
    rows, cols = 513, 257
    matrix = _payload(rank, right, rows * cols, torch.float32, dev, 2).view(cols, rows).t()
    holder = torch.full((rows, cols + 3), -1.0, device=dev)
    target = holder[:, 1:cols + 1]
    reqs = [dist.isend(matrix, right), dist.irecv(target, left)]
    for r in reqs:
        r.wait()
    eq("strided recv", target,
       _payload(left, rank, rows * cols, torch.float32, dev, 2).view(cols, rows).t())
    eq("untouched columns", holder[:, 0], torch.full((rows,), -1.0, device=dev))

    # batch_isend_irecv, both directions at once.
    got_l = torch.empty(70_000, dtype=torch.float16, device=dev)
    got_r = torch.empty(70_000, dtype=torch.float16, device=dev)
    ops = [dist.P2POp(dist.isend, _payload(rank, right, 70_000, torch.float16, dev, 3), right),
           dist.P2POp(dist.isend, _payload(rank, left, 70_000, torch.float16, dev, 3), left),
           dist.P2POp(dist.irecv, got_l, left), dist.P2POp(dist.irecv, got_r, right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    # (With 2 ranks left and right are one peer: its two messages match the
    # two recvs in posting order, and both carry the same payload.)
    eq("batch from the left", got_l, _payload(left, rank, 70_000, torch.float16, dev, 3))
    eq("batch from the right", got_r, _payload(right, rank, 70_000, torch.float16, dev, 3))

    # Any-source recvs on rank 0: one message from each other rank, each
    # reported with its sender. Their own tag: a rank done with its send
    # goes on to the next step, whose message to rank 0 (tag 0) an
    # any-source recv of tag 0 may rightly take first (seen with 3 ranks).
    any_tag = 4
    if rank == 0:
        seen = []
        for _ in range(ws - 1):
            got = torch.empty(5000, dtype=torch.int32, device=dev)
            src = dist.recv(got, tag=any_tag)
            seen.append(src)
            eq(f"any-source recv from {src}", got, _payload(src, 0, 5000, torch.int32, dev, 4))
        if sorted(seen) != list(range(1, ws)):
            failures.append(f"rank 0: any-source recvs came from {seen}")
    else:
        dist.send(_payload(rank, 0, 5000, torch.int32, dev, 4), 0, tag=any_tag)

    # synchronize() orders the current stream after the recv: a consumer
    # queued right after it sees the data without any host synchronization.
    got = torch.zeros(1 << 20, device=dev)
    work = dist.irecv(got, left)
    dist.send(_payload(rank, right, 1 << 20, torch.float32, dev, 5), right)
    work.synchronize()
    total = got.sum()  # queued on the current stream after synchronize()
    want = _payload(left, rank, 1 << 20, torch.float32, dev, 5).sum()
    if float(total) != float(want):
        failures.append(f"rank {rank}: a consumer after synchronize() saw sum {float(total)}, "
                        f"expected {float(want)}")
    torch.cuda.synchronize()
    return {"failures": failures, "device_p2p_ops": _device_p2p_ops()}


@pytest.mark.parametrize("path", list(P2P_PATHS))
@pytest.mark.parametrize("world_size", [2, 3])
def test_p2p_on_cuda_tensors_is_exact(world_size, path):
    res = harness.run_ranks(_values, world_size, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            env=P2P_PATHS[path], ref_group=False)
    for r in res:
        assert r["failures"] == [], r["failures"]
    for rank, r in enumerate(res):
        if path == "staged":
            assert r["device_p2p_ops"] == 0, (rank, r)
        else:
            # Every send and recv above took the device pools.
            assert r["device_p2p_ops"] >= 10, (rank, r)


def _killed_peer(ctx):
    """Rank 2 is SIGKILLed while ranks 0 and 1 wait in a CUDA recv from it: the
    recvs fail naming it, in time, and CUDA P2P between the survivors goes on."""
    from elastic_checks import check_failed_work, wait_facts
    dev = use_rank_gpu(ctx.rank)
    if ctx.rank == 2:
        for r in (0, 1):
            ctx.wait_for(f"posted_{r}", 60)
        ctx.kill_self()
    t0 = time.monotonic()
    work = dist.irecv(torch.zeros(1 << 16, device=dev), src=2)
    ctx.signal(f"posted_{ctx.rank}")
    res = wait_facts(work)
    res["elapsed_s"] = time.monotonic() - t0
    check_failed_work(res, 3, {2}, r"recv from rank 2 .* failed: PEER_FAILURE: rank 2 "
                                   r"(failed|is no longer an active member)")
    peer = 1 - ctx.rank
    got = torch.zeros(1 << 20, device=dev)
    reqs = [dist.isend(_payload(ctx.rank, peer, 1 << 20, torch.float32, dev), peer),
            dist.irecv(got, peer)]
    for r in reqs:
        r.wait()
    exact = torch.equal(got.cpu(), _payload(peer, ctx.rank, 1 << 20, torch.float32, dev).cpu())
    return {"elapsed_s": res["elapsed_s"], "exact_after": exact,
            "device_p2p_ops": _device_p2p_ops()}


def test_a_sigkilled_peer_fails_a_pending_cuda_recv_naming_it():
    from elastic_checks import ELASTIC_ENV
    res = harness.run_ranks(_killed_peer, 3, BACKEND, timeout_s=JOB_TIMEOUT_S,
                            env={**ELASTIC_ENV, **PATHS["kernels"]}, ref_group=False,
                            expect_killed=[2])
    for rank in (0, 1):
        assert res[rank]["exact_after"], res[rank]
        assert res[rank]["elapsed_s"] < 30.0, res[rank]
        assert res[rank]["device_p2p_ops"] >= 3, res[rank]
