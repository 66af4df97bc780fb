"""The CUDA fast path behind Buffer: setup through the group, launches, the error word.

Setup (every rank, inside Buffer's metadata exchange):
  1. the metadata all_gather carries each rank's host id, CUDA device, whether
     it can run the fast path, and a random nonce; every rank takes rank 0's
     nonce as the key prefix of this connection in the group's c10d store;
  2. rank 0 puts a fresh secret under that prefix, the others read it;
  3. each rank starts its transfer engine, allocates and zeroes its EP buffer
     (all_gather of ok + address), then maps every peer's buffer over
     cuda_ipc (all_gather of ok: also the meeting after which peers write).
Any rank failing a step makes every rank use the fallback, with the reason.

Errors of the kernels that depend on data (expert ids outside
[-1, num_experts)) go to a device error word. After each launch the runtime
copies it to pinned host memory asynchronously; the host looks at that copy
only once it has landed (a non-blocking event query), at the next
dispatch/combine/get_next_combine_buffer call, hook() or
EventOverlap.current_stream_wait() of this Buffer, and raises RuntimeError
there. Nothing in the hot path waits for the device.
"""

import os
import secrets
import socket
import zlib

import torch
import torch.distributed as dist

from mooncake import _ep_runtime
from mooncake._ep_checks import HIDDEN_ALIGN

# Layout constants of mooncake-ep/core/buffer_layout.h (the pure-Python size
# formula below must equal epBufferSizeHint; a test compares them).
_STATE_BYTES = 256
_REGION_ALIGN = 256
_HEADER_BYTES = 128

SETUP_TIMEOUT_ENV = "MOONCAKE_EP_SETUP_TIMEOUT_MS"
# FP8 dispatches write rows straight into a slot of the owner's buffer
# (docs/ep-guide.md, "Direct FP8 dispatch"): on unless a rank sets it to 0.
DIRECT_DISPATCH_ENV = "MC_EP_DIRECT_DISPATCH"
_DIRECT_SLOTS = 3  # kEpDirectSlots
_ERRORS = {1: "a topk_idx entry is outside [-1, num_experts)"}


def direct_dispatch_requested():
    """Whether this rank asks for direct FP8 dispatch (unless DIRECT_DISPATCH_ENV=0)."""
    return os.environ.get(DIRECT_DISPATCH_ENV, "1") != "0"


def _align(n):
    return -(-n // _REGION_ALIGN) * _REGION_ALIGN


def size_hint_python(max_tokens, hidden, num_ranks, num_experts, direct=False):
    """The runtime's buffer_size_hint in Python, for builds without the runtime:
    epBufferSizeHint, plus EpLayout's direct area (header and slots) when `direct`."""
    signal = _align(8 * (num_experts + num_experts))
    dispatch = num_experts * max_tokens * (_HEADER_BYTES + 2 * hidden)
    combine = num_experts * max_tokens * hidden * 2
    total = _STATE_BYTES + 2 * (signal + dispatch + combine)
    if not direct:
        return total
    local, rows = num_experts // num_ranks, num_ranks * max_tokens
    header = _align(8 * num_experts + 16 + 16 * local * num_ranks)
    slot = (_align(8 * local) + _align(local * rows * hidden) +
            _align(local * rows * (hidden // HIDDEN_ALIGN) * 4) + _align(local * rows * 4))
    return total + header + _DIRECT_SLOTS * slot


def size_hint(max_tokens, hidden, num_ranks, num_experts, direct=None):
    """Workspace bytes; `direct` (default: as this rank asks) adds direct dispatch's slots.
    A buffer without them still takes every op (direct=False is the minimum)."""
    if direct is None:
        direct = direct_dispatch_requested()
    module = _ep_runtime.runtime()
    if module is None:
        return size_hint_python(max_tokens, hidden, num_ranks, num_experts, direct)
    return int(module.buffer_size_hint(max_tokens, hidden, num_ranks, num_experts, direct=direct))


def host_id():
    """A 63-bit id of this host (ranks with equal ids share cuda_ipc)."""
    return zlib.crc32(socket.gethostname().encode()) | (
        zlib.adler32(socket.gethostname().encode()) << 31)


def device_id(device):
    """A 62-bit id of CUDA device `device` (ranks with equal ids share one GPU)."""
    uuid = str(torch.cuda.get_device_properties(device).uuid).encode()
    return zlib.crc32(uuid) | (zlib.adler32(uuid) & 0x3FFFFFFF) << 32


def local_reason(num_bytes):
    """None when this rank could run the fast path, else why not."""
    reason = _ep_runtime.unavailable_reason()
    if reason is not None:
        return reason
    if num_bytes < _STATE_BYTES:
        return f"num_ep_buffer_bytes={num_bytes} leaves no room for the fast path's buffer"
    return None


def _all_gather_ints(values, group, device):
    mine = torch.tensor(values, dtype=torch.int64)
    out = [torch.zeros_like(mine, device=device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine.to(device), group=group)
    return torch.stack([t.cpu() for t in out])


def ranks_without(ok, group, device):
    """The ranks of `group` where `ok` was false, from one all_gather: every rank
    gets the same list (empty when all were ok)."""
    flags = _all_gather_ints([1 if ok else 0], group, device)[:, 0]
    return torch.nonzero(flags == 0).flatten().tolist()


def _group_store(group, nonce):
    """The group's c10d store under a prefix every rank of this connection agrees on."""
    store = dist.distributed_c10d._get_default_store()
    return dist.PrefixStore(f"mooncake_ep/{nonce:016x}/", store)


def connect(group, rank, num_ranks, num_bytes, nonce, comm_device, ranks_per_device=1,
            hosts=None):
    """(runtime Buffer or None, reason or None); every rank gets the same outcome.

    `ranks_per_device`: how many ranks of the group run on this rank's GPU
    (several processes on one GPU bound the kernels' spinning grids).
    `hosts`: every rank's host id, when they differ: peers on this rank's host
    are mapped over cuda_ipc, the others reached over IBGDA (connect_ibgda).
    """
    module = _ep_runtime.runtime()
    device = torch.cuda.current_device()
    timeout_ms = int(os.environ.get(SETUP_TIMEOUT_ENV, "30000"))
    fast, error, addr = None, None, 0
    try:
        store = _group_store(group, nonce)
        if rank == 0:
            store.set("secret", secrets.token_hex(16))
        secret = store.get("secret").decode()
        fast = module.Buffer(store, "", secret, rank, num_ranks, num_bytes, device, timeout_ms,
                             ranks_per_device)
        addr = fast.local_address()
    except Exception as e:  # noqa: BLE001 - reported to every rank below
        error = f"{type(e).__name__}: {e}"
    direct = direct_dispatch_requested()
    table = _all_gather_ints([0 if error else 1, addr, int(direct)], group, comm_device)
    if not bool((table[:, 0] == 1).all()):
        bad = torch.nonzero(table[:, 0] == 0).flatten().tolist()
        return None, _failed(bad, "could not allocate the fast path's buffer", error)
    # Direct FP8 dispatch only when every rank asked for it (a sender writes
    # in place only to an owner that reads in place).
    fast.set_direct_dispatch(bool((table[:, 2] == 1).all()))
    multi_host = hosts is not None and len(set(hosts)) > 1
    p2p = [h == hosts[rank] for h in hosts] if multi_host else []
    try:
        fast.connect(table[:, 1].tolist(), p2p)
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    bad = ranks_without(error is None, group, comm_device)
    if bad:
        what = "the peers on their host" if multi_host else "every peer's buffer"
        return None, _failed(bad, f"could not map {what} over cuda_ipc", error)
    if multi_host:
        reason = connect_ibgda(module, fast, group, rank, num_ranks, num_bytes, comm_device)
        if reason is not None:
            return None, reason
    return fast, None


def connect_ibgda(module, fast, group, rank, num_ranks, num_bytes, comm_device):
    """Reaches `fast`'s peers on other hosts over IBGDA (seed 000's connect()).

    Each rank makes an IbgdaLink on its buffer (send staging, endpoint with
    MOONCAKE_EP_ACTIVE_QPS_PER_RANK QPs per peer, on the first capable device
    mooncake.pg.set_device_filter admits), the group exchanges the
    endpoints' words (_ep_ibgda.exchange), then each rank maps its queues for
    the kernels and attaches the link. None when every rank succeeded, else
    the same reason on every rank, naming the ranks that failed.
    """
    from mooncake import _ep_ibgda  # noqa: PLC0415 - only multi-host Buffers need it

    link, error = None, None
    try:
        link = module.IbgdaLink(rank, num_ranks, fast.local_address(), num_bytes,
                                device_filter=_ep_runtime.device_filter())
    except Exception as e:  # noqa: BLE001 - reported to every rank below
        error = f"{type(e).__name__}: {e}"
    bad = ranks_without(error is None, group, comm_device)
    if bad:
        return _failed(bad, "could not set up IBGDA (queue pairs, registration)", error)
    try:
        _ep_ibgda.exchange(link, group, comm_device)
    except RuntimeError as e:
        return str(e)
    try:
        link.activate()
        module.attach_ibgda(fast, link)
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    bad = ranks_without(error is None, group, comm_device)
    if bad:
        return _failed(bad, "could not map their IBGDA queues into the GPU", error)
    return None


def _failed(ranks, what, mine):
    text = f"ranks {ranks} {what}"
    return text + (f" (this rank: {mine})" if mine else "")


def raise_device_error(fast, wait=False):
    """RuntimeError when a completed op of `fast` left an error in the device word."""
    if fast is None:
        return
    err = fast.take_error(wait)
    if err is None:
        return
    code, info = err
    what = _ERRORS.get(code, f"device error {code}")
    raise RuntimeError(
        f"Mooncake EP fast path: an earlier dispatch/combine on this Buffer failed on the "
        f"device: {what} (value {info}); such entries were skipped, so that op's outputs "
        f"lack them. The error is now cleared and the Buffer stays usable; expected topk_idx "
        f"entries in [0, num_experts) or -1"
    )


class FastRoute:
    """What combine needs from a fast-path dispatch (the handle carries the rest)."""

    __slots__ = ("topk_idx", "num_tokens")

    def __init__(self, topk_idx, num_tokens):
        self.topk_idx = topk_idx
        self.num_tokens = num_tokens
