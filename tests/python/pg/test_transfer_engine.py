"""mooncake.engine.TransferEngine and pg.set_transfer_engine, in real processes.

* Two processes exchange bytes through their engines (write, read and the
  list form; unaligned offsets; 1 byte to 1.5 MiB; shared memory and tcp).
* Bad input raises ValueError / TypeError / TimeoutError naming the argument.
* Groups created after set_transfer_engine (2 and 3 ranks) run collectives
  and P2P on the shared engine; a subgroup shares it with the world group;
  close() is refused while they exist; destroy + a new group on the same
  engine works; set_transfer_engine(None) reverts to per-group engines.
* Ranks that disagree on the engine fail init on every rank.

Expected values are computed in the test from the rank and the sizes.
"""

import ctypes
import datetime
import time

import pytest
import torch
import torch.distributed as dist

import harness

JOB_TIMEOUT_S = 120
STORE_TIMEOUT = datetime.timedelta(seconds=60)
SIZES = (1, 7, 4099, (3 << 19) + 3)  # the last one is 1.5 MiB + 3
SPACING = 5  # bytes between the regions of consecutive sizes


@pytest.fixture(autouse=True)
def _mooncake_only(backend):
    if not harness.is_mooncake(backend):
        pytest.skip("TransferEngine is a Mooncake API")


def _pattern(rank, n, salt):
    """n bytes that depend on rank and salt; never the same for two ranks or salts."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 31 + rank * 7 + salt * 13) % 251).to(torch.uint8)


def _peek(addr, n):
    return torch.frombuffer(bytearray(ctypes.string_at(addr, n)), dtype=torch.uint8)


def _poke(addr, data):
    ctypes.memmove(addr, data.numpy().tobytes(), data.numel())


def _layout(start):
    """(offset, size) per size, unaligned and non-overlapping, starting at `start`."""
    out, off = [], start
    for n in SIZES:
        out.append((off, n))
        off += n + SPACING
    return out


def _store(ctx, port):
    return dist.TCPStore("127.0.0.1", port, ctx.world_size, is_master=(ctx.rank == 0),
                         timeout=STORE_TIMEOUT)


def _store_barrier(store, name, n, counted=False):
    if not counted:
        store.add(name, 1)
    deadline = time.monotonic() + 60
    while int(store.add(name, 0)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"store barrier {name!r} not reached by {n} processes in 60 s")
        time.sleep(0.005)


def _leave(ctx, store):
    """Rank 0 hosts the store: it returns only after every other rank is done with it."""
    store.add("left", 1)
    if ctx.rank == 0:
        _store_barrier(store, "left", ctx.world_size, counted=True)


# --------------------------------------------------------------------------- raw byte exchange

BUF = 4 << 20
PREFILL = (2 << 20) + 1  # the peer reads from here on


def _exchange_worker(ctx, port):
    from mooncake.engine import TransferEngine

    r, peer = ctx.rank, 1 - ctx.rank
    store = _store(ctx, port)
    engine = TransferEngine(store)
    shared = engine.allocate_shared(BUF)  # peers write here (shm on this host)
    plain = _pattern(r, BUF, salt=1)      # registered ordinary memory (tcp)
    engine.register_memory(plain.data_ptr(), plain.numel())
    src = _pattern(r, BUF, salt=2)
    engine.register_memory(src.data_ptr(), src.numel())
    dst = torch.zeros(BUF, dtype=torch.uint8)
    engine.register_memory(dst.data_ptr(), dst.numel())
    _poke(shared + PREFILL, _pattern(r, BUF - PREFILL, salt=3))
    store.set(f"ep/{r}", f"{engine.segment_name}#{shared}#{plain.data_ptr()}")

    name, peer_shared, peer_plain = store.get(f"ep/{peer}").decode().split("#")
    peer_shared, peer_plain = int(peer_shared), int(peer_plain)
    seg = engine.open_segment(name, timeout_s=30)

    # Writes: src[off+1 : off+1+n] -> peer shared[off : off+n], and the same
    # through the list form into the peer's plain memory.
    for off, n in _layout(11):
        engine.write(seg, src.data_ptr() + off + 1, peer_shared + off, n)
    engine.transfer([("write", seg, src.data_ptr() + off + 1, peer_plain + off, n)
                     for off, n in _layout(17)], timeout_s=30)
    # Reads from the peer's prefilled shared memory and from its plain memory.
    for off, n in _layout(3):
        engine.read(seg, dst.data_ptr() + off, peer_shared + PREFILL + off + 2, n)
    engine.transfer([("read", seg, dst.data_ptr() + (2 << 20) + off, peer_plain + (2 << 20) + off, n)
                     for off, n in _layout(1)[:3]], timeout_s=30)
    _store_barrier(store, "written", 2)

    bad = []
    peer_src = _pattern(peer, BUF, salt=2)
    for off, n in _layout(11):
        if not torch.equal(_peek(shared + off, n), peer_src[off + 1:off + 1 + n]):
            bad.append(f"write of {n} bytes into shared memory at +{off}")
    for off, n in _layout(17):
        if not torch.equal(plain[off:off + n], peer_src[off + 1:off + 1 + n]):
            bad.append(f"listed write of {n} bytes into plain memory at +{off}")
    peer_prefill = _pattern(peer, BUF - PREFILL, salt=3)
    for off, n in _layout(3):
        if not torch.equal(dst[off:off + n], peer_prefill[off + 2:off + 2 + n]):
            bad.append(f"read of {n} bytes from shared memory at +{off}")
    peer_plain_data = _pattern(peer, BUF, salt=1)
    for off, n in _layout(1)[:3]:
        at = (2 << 20) + off
        if not torch.equal(dst[at:at + n], peer_plain_data[at:at + n]):
            bad.append(f"listed read of {n} bytes from plain memory at +{at}")
    # Bytes between the written regions stay untouched.
    gaps = [off + n for off, n in _layout(11)]
    if any(_peek(shared + g, SPACING).tolist() != [0] * SPACING for g in gaps[:-1]):
        bad.append("bytes between written regions of shared memory changed")
    _store_barrier(store, "checked", 2)
    engine.close()
    assert engine.closed
    engine.close()  # idempotent
    _leave(ctx, store)
    return bad


# "engine_path", not "transport": that name is conftest's fixture for the PG
# suites' shm/tcp parametrization.
@pytest.mark.parametrize("engine_path", ["default", "tcp"])
def test_two_processes_exchange_bytes(backend, engine_path):
    env = {"MC_FORCE_TCP": "1"} if engine_path == "tcp" else {"MC_FORCE_TCP": None}
    res = harness.run_ranks(_exchange_worker, 2, backend, JOB_TIMEOUT_S, env=env, init=False,
                            ref_group=False, args=(harness.free_port(),))
    assert res == [[], []], res


# --------------------------------------------------------------------------- bad input

def _raises(exc, pattern, fn, *args, **kwargs):
    import re
    try:
        fn(*args, **kwargs)
    except exc as e:
        if not re.search(pattern, str(e)):
            return f"{fn.__name__}: {type(e).__name__} {e!s:.300} does not match {pattern!r}"
        return None
    except Exception as e:  # noqa: BLE001
        return f"{fn.__name__}: raised {type(e).__name__}: {e!s:.300}, expected {exc.__name__}"
    return f"{fn.__name__}{args}: did not raise {exc.__name__}"


def _bad_input_worker(ctx, port):
    from mooncake import pg
    from mooncake.engine import TransferEngine

    r, peer = ctx.rank, 1 - ctx.rank
    store = _store(ctx, port)
    engine = TransferEngine(store, segment_name=f"bad-input-{r}")
    mem = engine.allocate_shared(1 << 16)
    store.set(f"ep/{r}", f"{engine.segment_name}#{mem}")
    name, peer_mem = store.get(f"ep/{peer}").decode().split("#")
    peer_mem = int(peer_mem)
    seg = engine.open_segment(name)
    unregistered = torch.zeros(64, dtype=torch.uint8)
    problems = [
        _raises(ValueError, r"remote_ptr=0x[0-9a-f]+.*not inside a remotely accessible region",
                engine.write, seg, mem, peer_mem + (1 << 16) - 10, 100),
        _raises(ValueError, r"local_ptr=.*not inside a locally registered region",
                engine.read, seg, unregistered.data_ptr(), peer_mem, 64),
        _raises(ValueError, r"segment id 999 is not open", engine.write, 999, mem, peer_mem, 8),
        _raises(TypeError, r"segment_id must be an int.*got str", engine.write, "x", mem, peer_mem, 8),
        _raises(ValueError, r"length=0; expected a positive byte count",
                engine.write, seg, mem, peer_mem, 0),
        _raises(TypeError, r"local_ptr must be an int.*got float", engine.write, seg, 1.5, peer_mem, 8),
        _raises(ValueError, r"remote_ptr=-4; expected a non-null address",
                engine.write, seg, mem, -4, 8),
        _raises(ValueError, r"timeout_s=-1; expected a positive",
                engine.write, seg, mem, peer_mem, 8, timeout_s=-1),
        _raises(ValueError, r"ptr=0; expected a non-null address", engine.register_memory, 0, 10),
        _raises(ValueError, r"free_shared\(ptr=0x[0-9a-f]+\)", engine.free_shared,
                unregistered.data_ptr()),
        _raises(ValueError, r"requests\[1\]: op='copy'; expected 'write' or 'read'",
                engine.transfer, [("write", seg, mem, peer_mem, 8), ("copy", seg, mem, peer_mem, 8)]),
        _raises(TypeError, r"store must be a torch.distributed.Store.*got str", TransferEngine, "s"),
        _raises(ValueError, r"segment_name 'bad-input-0' is already used", TransferEngine, store,
                segment_name="bad-input-0"),
        _raises(TypeError, r"engine must be a mooncake.engine.TransferEngine or None, got int",
                pg.set_transfer_engine, 42),
    ]
    t0 = time.monotonic()
    problems.append(_raises(TimeoutError, r"open_segment\(name='no-such-engine'\)",
                            engine.open_segment, "no-such-engine", timeout_s=0.3))
    waited = time.monotonic() - t0
    if not 0.25 <= waited < 5:
        problems.append(f"open_segment with timeout_s=0.3 returned after {waited:.2f} s")
    _store_barrier(store, "done", 2)
    engine.close()
    _leave(ctx, store)
    problems += [
        _raises(RuntimeError, r"is closed", engine.allocate_shared, 64),
        _raises(RuntimeError, r"is closed", engine.open_segment, name),
        _raises(ValueError, r"is closed; expected an open engine", pg.set_transfer_engine, engine),
    ]
    return [p for p in problems if p]


def test_bad_input_raises_naming_the_argument(backend):
    res = harness.run_ranks(_bad_input_worker, 2, backend, JOB_TIMEOUT_S, init=False,
                            ref_group=False, args=(harness.free_port(),))
    assert res == [[], []], res


# --------------------------------------------------------------------------- groups on the engine

def _check_ops(ctx, group=None, tag=""):
    """all_reduce, all_gather, broadcast and a P2P ring on `group`; returns problems."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(ctx.world_size))
    me = dist.get_rank(group) if group is not None else ctx.rank
    n, bad = len(ranks), []
    x = torch.arange(1000, dtype=torch.float32) + 100.0 * me
    dist.all_reduce(x, group=group)
    want = torch.arange(1000, dtype=torch.float32) * n + 100.0 * sum(range(n))
    if not torch.equal(x, want):
        bad.append(f"{tag} all_reduce")
    out = [torch.empty(5, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(out, torch.full((5,), 7 * me + 1, dtype=torch.int64), group=group)
    if [o.tolist() for o in out] != [[7 * i + 1] * 5 for i in range(n)]:
        bad.append(f"{tag} all_gather")
    b = torch.full((3000,), float(me))
    dist.broadcast(b, src=ranks[n - 1], group=group)
    if not torch.equal(b, torch.full((3000,), float(n - 1))):
        bad.append(f"{tag} broadcast")
    send = torch.full((40000,), me * 10 + 1, dtype=torch.int32)
    recv = torch.zeros(40000, dtype=torch.int32)
    works = [dist.isend(send, ranks[(me + 1) % n], group=group),
             dist.irecv(recv, ranks[(me - 1) % n], group=group)]
    for w in works:
        w.wait()
    if not torch.equal(recv, torch.full((40000,), ((me - 1) % n) * 10 + 1, dtype=torch.int32)):
        bad.append(f"{tag} send/recv ring")
    # A completed isend may only be staged at the sender; destroying the
    # group before the receiver has it would drop it.
    dist.barrier(group=group)
    return bad


def _init(ctx, store):
    dist.init_process_group(backend=ctx.backend, store=store, rank=ctx.rank,
                            world_size=ctx.world_size, timeout=STORE_TIMEOUT)


def _stores(ctx, ports):
    """TCPStores on ports picked in advance, bound before the test starts any
    transfer engine: an engine's listeners take ephemeral ports, and one of
    them could otherwise take a picked port first (EADDRINUSE)."""
    return [_store(ctx, p) for p in ports]


def _groups_worker(ctx, engine_port, ports):
    from mooncake import pg
    from mooncake.engine import TransferEngine

    bad = []
    engine_store, *group_stores = _stores(ctx, [engine_port] + list(ports))
    engine = TransferEngine(engine_store)
    pg.set_transfer_engine(engine)

    ctx.note("world group on the shared engine")
    _init(ctx, group_stores[0])
    bad += _check_ops(ctx, tag="world")
    if engine.num_groups != 1:
        bad.append(f"world: num_groups={engine.num_groups}, expected 1")
    sub = dist.new_group([0, 1])
    if ctx.rank in (0, 1):
        bad += _check_ops(ctx, sub, tag="subgroup")
    want = 2 if ctx.rank in (0, 1) else 1
    if engine.num_groups != want:
        bad.append(f"with subgroup: num_groups={engine.num_groups}, expected {want}")
    try:
        engine.close()
        bad.append("close() with live groups did not raise")
    except RuntimeError as e:
        if f"{want} process group(s) still use this engine" not in str(e):
            bad.append(f"close() refused with an unexpected message: {e}")
    bad += _check_ops(ctx, tag="world after refused close")
    dist.destroy_process_group()
    if engine.num_groups != 0:
        bad.append(f"after destroy: num_groups={engine.num_groups}, expected 0")

    ctx.note("a new group on the same engine")
    _init(ctx, group_stores[1])
    bad += _check_ops(ctx, tag="second world")
    dist.destroy_process_group()

    ctx.note("set_transfer_engine(None): per-group engines again")
    pg.set_transfer_engine(None)
    _init(ctx, group_stores[2])
    if engine.num_groups != 0:
        bad.append(f"per-group world: num_groups={engine.num_groups}, expected 0")
    bad += _check_ops(ctx, tag="per-group world")
    dist.destroy_process_group()
    engine.close()
    _leave(ctx, engine_store)
    return bad


@pytest.mark.parametrize("world_size", [2, 3])
def test_groups_on_a_shared_engine(backend, world_size):
    res = harness.run_ranks(_groups_worker, world_size, backend, JOB_TIMEOUT_S, init=False,
                            ref_group=False, args=(harness.free_port(), harness.free_ports(3)))
    assert res == [[]] * world_size, res


# --------------------------------------------------------------------------- mismatch

def _mismatch_worker(ctx, engine_ports, group_port, odd):
    from mooncake import pg
    from mooncake.engine import TransferEngine

    engine = None
    group_store = _store(ctx, group_port)  # before any engine listens (see _stores)
    if ctx.rank != 2 or odd == "other-store":
        # Rank 2 uses a store of its own in the "other-store" case.
        port = engine_ports[1] if ctx.rank == 2 else engine_ports[0]
        store = dist.TCPStore("127.0.0.1", port, 1 if ctx.rank == 2 else 2,
                              is_master=ctx.rank in (0, 2), timeout=STORE_TIMEOUT)
        engine = TransferEngine(store)
        pg.set_transfer_engine(engine)
    try:
        _init(ctx, group_store)
    finally:
        # The failed group returned its lease: the engine can be closed.
        if engine is not None:
            assert engine.num_groups == 0, engine.num_groups
            engine.close()


@pytest.mark.parametrize("odd", ["per-group", "other-store"])
def test_mismatched_engine_choice_fails_init_on_every_rank(backend, odd):
    third = ("rank 2 uses its own per-group engine" if odd == "per-group"
             else "rank 2 uses a shared engine")
    pattern = rf"the ranks disagree on the transfer engine.*{third}"
    res = harness.run_ranks(_mismatch_worker, 3, backend, JOB_TIMEOUT_S, init=False,
                            ref_group=False, expect_fail=pattern,
                            args=(harness.free_ports(2), harness.free_port(), odd))
    assert all(isinstance(x, harness.RankError) for x in res), res
