"""Mooncake transfer engine for Python: move bytes between processes yourself.

::

    import torch.distributed as dist
    from mooncake.engine import TransferEngine

    store = dist.TCPStore("10.0.0.1", 29500, world_size, is_master=(rank == 0))
    engine = TransferEngine(store)            # one per process, same store everywhere
    buf = engine.allocate_shared(1 << 20)     # registered; same-host peers map it
    store.set(f"buf/{rank}", f"{engine.segment_name}#{buf}")
    name, addr = store.get(f"buf/{peer}").decode().split("#")
    seg = engine.open_segment(name)
    engine.write(seg, buf, int(addr), 4096)   # returns once the bytes landed

``mooncake.pg.set_transfer_engine(engine)`` makes process groups created
afterwards use this engine instead of one engine per group. See
docs/transfer-engine.md for the full API.
"""

from mooncake import _loader

# The engine binding lives in the torch extension: its constructor takes a
# torch.distributed.Store.
_lib = _loader.load_versioned("pg", "Mooncake transfer engine")

TransferEngine = _lib.TransferEngine

__all__ = ["TransferEngine"]
