"""Mooncake EP Buffer: DeepEP low-latency style dispatch/combine with rank health.

    buffer = Buffer(group, Buffer.get_ep_buffer_size_hint(max_tokens, hidden, world, experts))
    recv_x, recv_count, handle, event, hook = buffer.dispatch(x, topk_idx, active_ranks, ...)
    combined, event, hook = buffer.combine(expert_out, topk_idx, topk_weights, active_ranks,
                                           timeout_us, handle)

Two paths share this API and produce the same layout and handle (the
encoding is documented in docs/ep-guide.md): the CUDA fast path of the
compiled runtime, and a fallback over the group's collectives that works on
any backend (gloo, mooncake-cpu, nccl, mooncake) and on CPU tensors.
`Buffer.use_fast_path` says which one a buffer uses and
`Buffer.fast_path_reason` why the fast path is off.
"""

import itertools
import os
import secrets

import torch
import torch.distributed as dist

from mooncake import _ep_checks as checks
from mooncake import _ep_runtime
from mooncake import _ep_fallback as fallback
from mooncake import _ep_fast as fast
from mooncake._ep_fallback import EPRankFailure, fp8_dequantize, fp8_quantize

__all__ = ["Buffer", "EPRankFailure", "EventOverlap", "fp8_dequantize", "fp8_quantize"]

_META_VERSION = 4  # bumps when the exchanged metadata changes meaning

_buffer_ids = itertools.count(1)

# Set to "1" while constructing a Buffer to make it use the fallback even where
# the fast path could run (benchmarks compare the two with it).
FORCE_FALLBACK_ENV = "MOONCAKE_EP_FORCE_FALLBACK"


class EventOverlap:
    """Completion of an EP op: `current_stream_wait()` orders the caller's stream after it.

    `event` is a torch.cuda.Event, or None when the op had already completed on
    the host (CPU tensors, or the fallback's synchronous collectives). With
    async_finish the tensors the op reads and writes are held in
    `extra_tensors` until this object goes away, so they outlive the op.
    Usable as a context manager: leaving the block waits like
    current_stream_wait().
    """

    def __init__(self, event=None, extra_tensors=None, check=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self._check = check  # fast path: raises a device error that has reached the host

    def current_stream_wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)
        if self._check is not None:
            self._check()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.current_stream_wait()
        return False


def _record_event(device, tensors, async_finish, check=None):
    if device.type != "cuda":
        return EventOverlap(None, tensors if async_finish else None)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return EventOverlap(event, tensors if async_finish else None, check)


class _Ticket:
    """The part of a handle that says which buffer, generation and dispatch made it."""

    __slots__ = ("buffer_id", "generation", "serial", "route", "use_fp8", "src_info",
                 "layout_range", "shape", "fast")

    def __repr__(self):
        return (f"<EP dispatch #{self.serial} of buffer {self.buffer_id} "
                f"generation {self.generation}>")


class Buffer:
    """EP runtime for one process group (see the module docstring and docs/ep-guide.md)."""

    @staticmethod
    def get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        """Workspace bytes for dispatches of up to that many tokens per rank.

        The CUDA runtime's buffer layout (also where the runtime is not built: a
        Python copy of the formula), with direct FP8 dispatch's three slots unless
        MC_EP_DIRECT_DISPATCH=0. A buffer of the size the hint gives with
        MC_EP_DIRECT_DISPATCH=0 is the minimum: it runs every op, FP8 dispatches
        through the copying receive.
        """
        checks.check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        checks.check_int("hidden", hidden, 1)
        checks.check_int("num_ranks", num_ranks, 1)
        checks.check_num_experts(num_experts, num_ranks)
        checks.check_hidden(hidden, "hidden")
        return fast.size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def __init__(self, group, num_ep_buffer_bytes=0):
        if group is None:
            group = dist.group.WORLD
        checks.check_int("num_ep_buffer_bytes", num_ep_buffer_bytes, 0)
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        self.num_ep_buffer_bytes = num_ep_buffer_bytes
        self._id = next(_buffer_ids)
        self._generation = 0
        self._serial = 0
        self._coll = fallback.Collectives(group, self.rank, self.group_size)
        self._fast = None
        self._device = None
        self._combine_buffers = {}
        self._connect()

    # -- membership --------------------------------------------------------

    def _connect(self):
        """Exchanges this rank's metadata through the group; every rank must agree."""
        # The previous connection goes first: its kernels finish, its mappings go.
        self._fast, self._device, self._combine_buffers = None, None, {}
        forced = os.environ.get(FORCE_FALLBACK_ENV, "") == "1"
        runtime_reason = fast.local_reason(self.num_ep_buffer_bytes)
        can_fast = 1 if runtime_reason is None and not forced else 0
        cuda_device = torch.cuda.current_device() if can_fast else -1
        # Not the generation: a replacement process starts a fresh Buffer while
        # survivors call update_ep_member(), and both must connect.
        device_id = fast.device_id(cuda_device) if can_fast else 0
        mine = [_META_VERSION, self.num_ep_buffer_bytes, can_fast, fast.host_id(), cuda_device,
                secrets.randbits(62), device_id]
        device = fallback.comm_device(self.group, torch.device("cpu"))
        table = fast._all_gather_ints(mine, self.group, device)
        sizes = table[:, 1]
        if not bool((sizes == sizes[0]).all()):
            raise ValueError(
                f"num_ep_buffer_bytes differs across ranks: {sizes.tolist()} (rank order); "
                f"every rank must pass the same value"
            )
        if not bool((table[:, 0] == _META_VERSION).all()):
            raise RuntimeError(
                f"Mooncake EP metadata versions differ across ranks: {table[:, 0].tolist()}; "
                f"every rank must run the same Mooncake build"
            )
        self.use_fast_path = False
        self.ibgda_peers = []  # ranks the fast path reaches over IBGDA (other hosts)
        if forced:
            self.fast_path_reason = f"{FORCE_FALLBACK_ENV}=1 was set when this Buffer was built"
        elif runtime_reason is not None:
            self.fast_path_reason = runtime_reason
        elif not bool((table[:, 2] == 1).all()):
            slow = torch.nonzero(table[:, 2] == 0).flatten().tolist()
            self.fast_path_reason = f"ranks {slow} cannot run the fast path"
        else:
            hosts = table[:, 3].tolist()
            multi_host = len(set(hosts)) > 1
            reason = self._ibgda_missing(hosts, device) if multi_host else None
            if reason is not None:
                self.fast_path_reason = reason
            else:
                sharing = int(((table[:, 3] == table[self.rank, 3]) &
                               (table[:, 6] == device_id)).sum())
                self._fast, self.fast_path_reason = fast.connect(
                    self.group, self.rank, self.group_size, self.num_ep_buffer_bytes,
                    int(table[0, 5]), device, ranks_per_device=sharing,
                    hosts=hosts if multi_host else None)
                if self._fast is not None:
                    self.use_fast_path = True
                    self._device = torch.device("cuda", cuda_device)
                    self.ibgda_peers = list(self._fast.remote_peers)

    def _ibgda_missing(self, hosts, device):
        """None when every rank can use IBGDA (needed across hosts), else why not."""
        without = fast.ranks_without(bool(_ep_runtime.ibgda_device()), self.group, device)
        if not without:
            return None
        return (f"the ranks are on {len(set(hosts))} hosts; the fast path reaches other hosts "
                f"over IBGDA, which ranks {without} cannot use (this rank: "
                f"{_ep_runtime.ibgda_reason()})")

    def update_ep_member(self):
        """Re-exchanges metadata after a membership change; older handles stop working.

        EP ranks are fixed when the Buffer is built (the layout and expert
        placement depend on them): a group whose size changed needs a new Buffer.
        """
        size = dist.get_world_size(self.group)
        if size != self.group_size:
            raise RuntimeError(
                f"the group now has {size} ranks but this Buffer was built for {self.group_size}; "
                f"EP ranks are fixed per Buffer: build a new Buffer for the new size"
            )
        self._generation += 1
        self._connect()

    # -- dispatch / combine --------------------------------------------------

    def _check_capacity(self, max_tokens, hidden, num_experts):
        # The minimum: a buffer without direct dispatch's slots runs every op
        # (FP8 ones through the copying receive).
        need = fast.size_hint(max_tokens, hidden, self.group_size, num_experts, direct=False)
        if self.num_ep_buffer_bytes < need:
            raise ValueError(
                f"num_ep_buffer_bytes={self.num_ep_buffer_bytes} is too small for "
                f"num_max_dispatch_tokens_per_rank={max_tokens}, hidden={hidden}, "
                f"num_ranks={self.group_size}, num_experts={num_experts}: expected at least "
                f"{need} (Buffer.get_ep_buffer_size_hint with {fast.DIRECT_DISPATCH_ENV}=0; "
                f"the hint without it adds direct FP8 dispatch's slots)"
            )

    def dispatch(self, x, topk_idx, active_ranks, num_max_dispatch_tokens_per_rank, num_experts,
                 timeout_us, use_fp8=True, async_finish=False, return_recv_hook=False):
        """Sends each token to the ranks of its top-k experts.

        Returns (recv_x or (data, scales), recv_count, handle, event, hook).
        """
        checks.check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        checks.check_num_experts(num_experts, self.group_size)
        checks.check_timeout(timeout_us)
        for name, value in (("use_fp8", use_fp8), ("async_finish", async_finish),
                            ("return_recv_hook", return_recv_hook)):
            checks.check_bool(name, value)
        _check_sync_mode(async_finish, return_recv_hook)
        checks.check_x(x, num_max_dispatch_tokens_per_rank)
        checks.check_topk_idx(topk_idx, x.size(0), x.device)
        checks.check_active_ranks(active_ranks, self.group_size, x.device)
        self._check_capacity(num_max_dispatch_tokens_per_rank, x.size(1), num_experts)

        use_fast = self._fast_for(x)
        if use_fast:
            self._check_device_error()
            recv_x, scales, recv_count, src_info, layout_range = self._fast.dispatch(
                x, topk_idx, active_ranks, num_max_dispatch_tokens_per_rank, num_experts,
                timeout_us, use_fp8)
            packed = (recv_x, scales) if use_fp8 else recv_x
            route = fast.FastRoute(topk_idx, x.size(0))
            # The receive is already enqueued on the stream (the kernels have no
            # separate receive launch): the hook only reports device errors.
            finish = self._check_device_error if return_recv_hook else None
        else:
            packed, recv_count, src_info, layout_range, route, finish = fallback.dispatch(
                self._coll, x, topk_idx, active_ranks, num_max_dispatch_tokens_per_rank,
                num_experts, use_fp8, timeout_us, defer=return_recv_hook)
        self._serial += 1
        ticket = _Ticket()
        ticket.buffer_id, ticket.generation, ticket.serial = self._id, self._generation, self._serial
        ticket.route, ticket.use_fp8 = route, use_fp8
        ticket.src_info, ticket.layout_range = src_info, layout_range
        ticket.shape = (num_max_dispatch_tokens_per_rank, x.size(1), num_experts)
        ticket.fast = use_fast
        handle = (src_info, layout_range, num_max_dispatch_tokens_per_rank, x.size(1),
                  num_experts, ticket)
        outputs = list(packed) if use_fp8 else [packed]
        event = _record_event(x.device, [x, topk_idx, *outputs, recv_count, src_info,
                                         layout_range, active_ranks], async_finish,
                              self._check_device_error if use_fast else None)
        return packed, recv_count, handle, event, _hook(finish)

    def _fast_for(self, x):
        """Whether an op on `x` runs on the fast path (CUDA data on this Buffer's device)."""
        if not self.use_fast_path or x.device.type != "cuda":
            return False  # CPU data: the fallback, with the same layout and handle
        if x.device != self._device:
            raise ValueError(
                f"x is on {x.device}; this Buffer's fast path runs on {self._device} (the "
                f"current CUDA device when it was built): expected tensors on {self._device}"
            )
        return True

    def _check_device_error(self):
        fast.raise_device_error(self._fast)

    def _ticket(self, handle):
        if not isinstance(handle, tuple) or len(handle) != 6 or not isinstance(handle[5], _Ticket):
            raise TypeError(
                f"handle must be the 6-tuple returned by Buffer.dispatch, got {type(handle).__name__}"
                + (f" of length {len(handle)}" if isinstance(handle, tuple) else "")
            )
        ticket = handle[5]
        if ticket.buffer_id != self._id:
            raise ValueError(f"handle {ticket!r} comes from another Buffer (this is buffer {self._id})")
        if ticket.generation != self._generation:
            raise ValueError(
                f"handle {ticket!r} predates update_ep_member() (current generation "
                f"{self._generation}); dispatch again"
            )
        if handle[0] is not ticket.src_info or handle[1] is not ticket.layout_range or tuple(
                handle[2:5]) != ticket.shape:
            raise ValueError(
                f"handle {ticket!r} was altered: its fields no longer match the dispatch that made it"
            )
        return ticket

    def combine(self, x, topk_idx, topk_weights, active_ranks, timeout_us, handle,
                zero_copy=False, async_finish=False, return_recv_hook=False, out=None):
        """Returns the expert outputs to their tokens, weighted: (combined_x, event, hook)."""
        ticket = self._ticket(handle)
        _, _, max_tokens, hidden, num_experts, _ = handle
        checks.check_timeout(timeout_us)
        for name, value in (("zero_copy", zero_copy), ("async_finish", async_finish),
                            ("return_recv_hook", return_recv_hook)):
            checks.check_bool(name, value)
        _check_sync_mode(async_finish, return_recv_hook)
        if zero_copy and not ticket.fast:
            raise NotImplementedError(
                f"zero_copy=True needs the fast path, which this buffer does not use: "
                f"{self._why_fallback()}; pass the expert outputs with zero_copy=False"
            )
        num_local = num_experts // self.group_size
        checks.check_expert_output(x, num_local, self.group_size * max_tokens, hidden)
        route = ticket.route
        checks.check_tensor("topk_idx", topk_idx)
        if topk_idx is not route.topk_idx and (
                topk_idx.shape != route.topk_idx.shape or topk_idx.dtype != torch.int64
                or not torch.equal(topk_idx, route.topk_idx)):
            raise ValueError(
                f"topk_idx (shape {tuple(topk_idx.shape)}) is not the topk_idx of the dispatch "
                f"that made handle {ticket!r}; combine must use its own dispatch's handle"
            )
        checks.check_topk_weights(topk_weights, topk_idx)
        if x.device != topk_idx.device:
            raise ValueError(f"x is on {x.device}; expected topk_idx's device {topk_idx.device}")
        checks.check_active_ranks(active_ranks, self.group_size, x.device)
        if out is None:
            out = torch.empty(route.num_tokens, hidden, dtype=torch.bfloat16, device=x.device)
        else:
            checks.check_out(out, route.num_tokens, hidden, x.device)

        if ticket.fast:
            self._check_device_error()
            src = x
            if zero_copy:
                src = self._combine_buffers.get(tuple(x.shape))
                if src is None:
                    raise ValueError(
                        f"combine(zero_copy=True) reads the expert outputs from "
                        f"get_next_combine_buffer(handle), which was not called for shape "
                        f"{tuple(x.shape)}: expected the outputs written there first"
                    )
            out = self._fast.combine(src, ticket.src_info, ticket.layout_range, topk_idx,
                                     topk_weights, active_ranks, max_tokens, num_experts,
                                     timeout_us, out)
            finish = self._check_device_error if return_recv_hook else None
            check = self._check_device_error
        else:
            out, finish = fallback.combine(self._coll, x, topk_idx, topk_weights, active_ranks,
                                           route, num_experts, timeout_us, out,
                                           defer=return_recv_hook)
            check = None
        event = _record_event(x.device, [x, topk_idx, topk_weights, out, ticket.src_info,
                                         ticket.layout_range, active_ranks], async_finish, check)
        return out, event, _hook(finish)

    def _why_fallback(self):
        if not self.use_fast_path:
            return self.fast_path_reason
        return "the dispatch of this handle ran on the fallback (its x was not a CUDA tensor)"

    def get_next_combine_buffer(self, handle):
        """The tensor to write expert outputs into for combine(zero_copy=True) (fast path only).

        A BF16 [num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, hidden]
        tensor owned by this Buffer (one per shape, reused by every combine of
        that shape): combine(zero_copy=True) reads the expert outputs from it,
        whatever `x` holds. It is ordinary device memory, not the IPC-mapped EP
        buffer: the combine kernel reads expert outputs in place from any local
        tensor and writes them straight into the owners' receive regions, so
        there is no staging copy for zero_copy to skip.
        """
        ticket = self._ticket(handle)
        if not ticket.fast:
            raise NotImplementedError(
                f"get_next_combine_buffer needs the fast path, which this buffer does not use: "
                f"{self._why_fallback()}"
            )
        self._check_device_error()
        max_tokens, hidden, num_experts = ticket.shape
        shape = (num_experts // self.group_size, self.group_size * max_tokens, hidden)
        buf = self._combine_buffers.get(shape)
        if buf is None:
            buf = torch.empty(shape, dtype=torch.bfloat16, device=self._device)
            self._combine_buffers[shape] = buf
        return buf


def _check_sync_mode(async_finish, return_recv_hook):
    if async_finish and return_recv_hook:
        raise ValueError(
            "async_finish=True and return_recv_hook=True are mutually exclusive: "
            "expected at most one of them"
        )


def _hook(finish):
    """With return_recv_hook: the callable that completes the receive (idempotent)."""
    if finish is None:
        return None
    done = []

    def hook():
        if not done:
            done.append(True)
            finish()

    return hook
