"""ElasticBuffer: the EP Buffer API with transport selection, destroy and recovery.

    buffer = ElasticBuffer(group, num_max_tokens_per_rank=128, hidden=4096, num_topk=8)
    buffer.transport            # "nccl" or "ibgda"
    recv_x, recv_count, handle, event, hook = buffer.dispatch(x, topk_idx, active_ranks, ...)
    combined, event, hook = buffer.combine(expert_out, topk_idx, topk_weights, active_ranks,
                                           timeout_us, handle)
    buffer.destroy()            # collective

dispatch/combine/get_next_combine_buffer take the arguments of `Buffer`'s
methods, with the same checks and results; `active_ranks` is honoured on
every transport. The transport is chosen once per generation, identically on
every rank, from what the ranks report (mooncake._ep_transport):
  * "ibgda": the `Buffer` machinery (cuda_ipc within a host, IBGDA across
    hosts when every rank can use it, else the fallback over the group's
    collectives: the path CPU machines and CI run);
  * "nccl": NCCL's device API (mooncake._ep_nccl), when built with
    USE_NCCL_DEVICE and the topology has compiled kernels.

The EP workspace depends on num_experts, which DeepEP's constructor does not
take: pass `num_experts=` to size it at construction, or it is sized by the
first dispatch (a collective like every dispatch). Recovery: after Mooncake
PG has restored every logical rank slot, survivors call update_ep_member()
and a replacement constructs an ElasticBuffer with the same arguments; both
run the same collectives. Handles and views made before an update are
rejected. See docs/ep-elastic-buffer.md.
"""

import os
import warnings

import torch
import torch.distributed as dist

from mooncake import _ep_checks as checks
from mooncake import _ep_fallback as fallback
from mooncake import _ep_fast as fast
from mooncake import _ep_runtime
from mooncake import _ep_transport as transports
from mooncake.mooncake_ep_buffer import Buffer, EPRankFailure, EventOverlap, _Ticket

__all__ = ["ElasticBuffer", "EPRankFailure", "EventOverlap"]

_META_VERSION = 3  # bumps when the exchanged row changes meaning (3: NCCL_GIN_NCONTEXTS)
# The NCCL transport's GIN contexts per communicator: NCCL reads it on every
# rank, and ranks that disagree build communicators that cannot talk.
_GIN_CONTEXTS_ENV = "NCCL_GIN_NCONTEXTS"


def _gin_contexts_code():
    """NCCL_GIN_NCONTEXTS as exchanged: its value, -1 when unset, -2 when not a count."""
    raw = os.environ.get(_GIN_CONTEXTS_ENV)
    if raw is None or raw.strip() == "":
        return -1
    try:
        value = int(raw)
    except ValueError:
        return -2
    return value if value >= 0 else -2


class ElasticBuffer:
    """EP runtime with transport auto-selection (see the module docstring)."""

    def __init__(self, group, num_max_tokens_per_rank, hidden, num_topk, transport="auto",
                 explicitly_destroy=False, *, num_experts=None):
        if group is None:
            group = dist.group.WORLD
        checks.check_int("num_max_tokens_per_rank", num_max_tokens_per_rank, 1)
        checks.check_int("hidden", hidden, 1)
        checks.check_hidden(hidden, "hidden")
        checks.check_int("num_topk", num_topk, 1)
        checks.check_bool("explicitly_destroy", explicitly_destroy)
        # A bad argument fails here, before the group is touched (the
        # environment variable is checked with the other ranks in _setup).
        transports.parse_transport(transport)
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        if num_experts is not None:
            checks.check_num_experts(num_experts, self.group_size)
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.hidden = hidden
        self.num_topk = num_topk
        self.explicitly_destroy = explicitly_destroy
        self._requested = transport
        self.num_experts = num_experts
        self.generation = 0
        self._inner = None
        self._stale_ids = set()  # inner Buffers of earlier generations
        self._views = []  # get_next_combine_buffer tensors of the current generation
        self._stale_views = []
        self._destroyed = False
        self._setup()

    # -- setup, recovery, destroy -------------------------------------------

    def _setup(self):
        """Agrees on the shape, the transport and num_experts; builds the workspace if known.

        The constructor and update_ep_member() run exactly these collectives,
        so survivors and a replacement meet here.
        """
        # A bad MOONCAKE_EP_TRANSPORT on one rank is reported by every rank
        # after the exchange, instead of leaving the others in it.
        try:
            mode, source = transports.requested_transport(self._requested)
            mode_code = transports.TRANSPORTS.index(mode)
        except ValueError as e:
            mode_code, source, bad_env = -1, transports.TRANSPORT_ENV, str(e)
        built, loaded = _ep_runtime.nccl_versions()
        # The GPU's UUID-based id, not its ordinal: under per-process
        # CUDA_VISIBLE_DEVICES every rank's ordinal is 0.
        device = fast.device_id(torch.cuda.current_device()) if torch.cuda.is_available() else -1
        mine = [_META_VERSION, self.num_max_tokens_per_rank, self.hidden, self.num_topk,
                mode_code, int(source != "argument"), fast.host_id(),
                device, built, loaded, self.num_experts or 0, _gin_contexts_code()]
        comm = fallback.comm_device(self.group, torch.device("cpu"))
        table = fast._all_gather_ints(mine, self.group, comm)
        for col, name in ((0, "ElasticBuffer metadata version"),
                          (1, "num_max_tokens_per_rank"), (2, "hidden"), (3, "num_topk")):
            values = table[:, col].tolist()
            if len(set(values)) != 1:
                raise ValueError(f"{name} differs across ranks: {values} (rank order); every "
                                 f"rank must construct the ElasticBuffer with the same value")
        bad = torch.nonzero(table[:, 4] < 0).flatten().tolist()
        if bad:
            mine = f" (this rank: {bad_env})" if mode_code < 0 else ""
            raise ValueError(f"ranks {bad} have an invalid {transports.TRANSPORT_ENV}{mine}; "
                             f"expected one of {', '.join(map(repr, transports.TRANSPORTS))}")
        known = sorted(set(v for v in table[:, 10].tolist() if v))
        if len(known) > 1:
            raise ValueError(f"num_experts differs across ranks: {table[:, 10].tolist()} (rank "
                             f"order, 0 = not given); expected one value")
        requests = [(transports.TRANSPORTS[int(m)], transports.TRANSPORT_ENV if s else "argument")
                    for m, s in zip(table[:, 4].tolist(), table[:, 5].tolist())]
        res = transports.resolve(requests, table[:, 6].tolist(), table[:, 7].tolist(),
                                 table[:, 8].tolist(), table[:, 9].tolist(),
                                 shapes=_ep_runtime.nccl_shapes() or transports.NCCL_SHAPES)
        if res.transport == "nccl":
            gin = table[:, 11].tolist()
            if len(set(gin)) != 1 or gin[0] == -2:
                shown = ["unset" if v == -1 else "not a count" if v == -2 else v for v in gin]
                raise ValueError(f"{_GIN_CONTEXTS_ENV} differs across ranks or is not a count: "
                                 f"{shown} (rank order); the NCCL transport needs one value "
                                 f"(or none) on every rank")
        self.transport = res.transport
        self.transport_reason = res.reason
        self._resolved_mode = res.requested
        self.topology = res.shape
        if known:
            self.num_experts = known[0]
            self._inner = self._build(known[0])

    def _build(self, num_experts):
        size = Buffer.get_ep_buffer_size_hint(self.num_max_tokens_per_rank, self.hidden,
                                              self.group_size, num_experts)
        if self.transport == "nccl":
            from mooncake import _ep_nccl
            try:
                return _ep_nccl.NcclBuffer(self.group, size, self.topology, num_experts,
                                           self.num_max_tokens_per_rank, self.hidden)
            except _ep_nccl.NcclSetupError as e:
                # Every rank raised alike (the setup's outcome is all-gathered).
                # Asked for by name, NCCL stays required; under "auto" the
                # group goes on over IPC/IBGDA, saying why.
                if self._resolved_mode != "auto":
                    raise
                self.transport = "ibgda"
                self.transport_reason = f"auto chose NCCL, but its setup failed: {e}"
        return Buffer(self.group, size)

    def update_ep_member(self):
        """Rebuilds the transport after Mooncake PG restored the group (collective).

        Every survivor calls it while each replacement constructs an
        ElasticBuffer with the same arguments; start no EP op before all have
        returned. The new generation is built before the old one is released,
        so both are held for a while (docs/ep-elastic-buffer.md says what that
        costs). Handles and views from before are rejected afterwards.
        """
        self._check_alive()
        size = dist.get_world_size(self.group)
        if size != self.group_size:
            raise RuntimeError(
                f"the group now has {size} ranks but this ElasticBuffer was built for "
                f"{self.group_size}; logical EP membership is fixed: restore every rank slot "
                f"through Mooncake PG before update_ep_member()")
        old = self._inner
        self._inner = None
        self.generation += 1
        try:
            self._setup()
        except BaseException:
            self._inner = old  # the old generation stays usable if nothing was replaced
            self.generation -= 1
            raise
        if old is not None:
            self._stale_ids.add(old._id)
            _release(old, collective=False)
        self._stale_views += self._views
        self._views = []

    def destroy(self):
        """Releases the transport's resources; collective (every rank calls it).

        The ranks meet first, so no peer still writes into this rank's buffer
        when it goes. Calling it again is a local no-op. Every op afterwards
        raises RuntimeError.
        """
        if self._destroyed:
            return
        comm = fallback.comm_device(self.group, torch.device("cpu"))
        fast._all_gather_ints([1], self.group, comm)  # the meeting
        inner, self._inner = self._inner, None
        self._destroyed = True
        self._views = []
        self._stale_views = []
        if inner is not None:
            _release(inner, collective=True)

    def __del__(self):
        if getattr(self, "explicitly_destroy", False) and not getattr(self, "_destroyed", True):
            warnings.warn("an ElasticBuffer built with explicitly_destroy=True was garbage "
                          "collected without destroy(); its resources are released locally",
                          ResourceWarning, stacklevel=2)

    def _check_alive(self):
        if self._destroyed:
            raise RuntimeError("this ElasticBuffer was destroyed (destroy() was called); "
                               "construct a new one")

    # -- properties of the current generation --------------------------------

    @property
    def use_fast_path(self):
        return self._inner is not None and self._inner.use_fast_path

    @property
    def fast_path_reason(self):
        if self._inner is None:
            return "the workspace is not built yet (it is sized by the first dispatch)"
        return self._inner.fast_path_reason

    # -- dispatch / combine --------------------------------------------------

    def dispatch(self, x, topk_idx, active_ranks, num_max_dispatch_tokens_per_rank, num_experts,
                 timeout_us, use_fp8=True, async_finish=False, return_recv_hook=False):
        """Buffer.dispatch on this generation's transport (same arguments and results)."""
        self._check_alive()
        checks.check_int("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank, 1)
        if num_max_dispatch_tokens_per_rank > self.num_max_tokens_per_rank:
            raise ValueError(
                f"num_max_dispatch_tokens_per_rank={num_max_dispatch_tokens_per_rank} exceeds "
                f"this ElasticBuffer's num_max_tokens_per_rank={self.num_max_tokens_per_rank}")
        checks.check_num_experts(num_experts, self.group_size)
        checks.check_x(x, num_max_dispatch_tokens_per_rank)
        if x.size(1) != self.hidden:
            raise ValueError(f"x has hidden size {x.size(1)}; this ElasticBuffer was built for "
                             f"hidden={self.hidden}")
        checks.check_topk_idx(topk_idx, x.size(0), x.device)
        if topk_idx.size(1) != self.num_topk:
            raise ValueError(f"topk_idx has {topk_idx.size(1)} columns; this ElasticBuffer was "
                             f"built for num_topk={self.num_topk}")
        if self._inner is None:
            self._first_dispatch(num_experts)
        elif num_experts != self.num_experts:
            raise ValueError(f"num_experts={num_experts}, but this ElasticBuffer's workspace "
                             f"was built for num_experts={self.num_experts}; expected "
                             f"{self.num_experts}")
        return self._inner.dispatch(x, topk_idx, active_ranks, num_max_dispatch_tokens_per_rank,
                                    num_experts, timeout_us, use_fp8, async_finish,
                                    return_recv_hook)

    def _first_dispatch(self, num_experts):
        """Sizes the workspace; every rank is in this dispatch, so it may meet the others."""
        comm = fallback.comm_device(self.group, torch.device("cpu"))
        table = fast._all_gather_ints([num_experts], self.group, comm)
        values = table[:, 0].tolist()
        if len(set(values)) != 1:
            raise ValueError(f"num_experts differs across ranks in the first dispatch: {values} "
                             f"(rank order); expected one value")
        self.num_experts = num_experts
        self._inner = self._build(num_experts)

    def _current(self, handle):
        """The inner Buffer, after rejecting handles of earlier generations."""
        self._check_alive()
        ticket = handle[5] if isinstance(handle, tuple) and len(handle) == 6 else None
        if isinstance(ticket, _Ticket) and ticket.buffer_id in self._stale_ids:
            raise ValueError(
                f"handle {ticket!r} predates update_ep_member() of this ElasticBuffer (now "
                f"generation {self.generation}); handles and views do not survive an update: "
                f"dispatch again")
        if self._inner is None:
            raise ValueError("no dispatch has run on this ElasticBuffer since it was built or "
                             "updated; expected a handle returned by its dispatch()")
        return self._inner

    def combine(self, x, topk_idx, topk_weights, active_ranks, timeout_us, handle,
                zero_copy=False, async_finish=False, return_recv_hook=False, out=None):
        """Buffer.combine on this generation's transport (same arguments and results)."""
        inner = self._current(handle)
        if isinstance(x, torch.Tensor) and any(x is v for v in self._stale_views):
            raise ValueError("x is a view returned by get_next_combine_buffer() before "
                             "update_ep_member(); views do not survive an update: call "
                             "get_next_combine_buffer(handle) again")
        return inner.combine(x, topk_idx, topk_weights, active_ranks, timeout_us, handle,
                             zero_copy, async_finish, return_recv_hook, out)

    def get_next_combine_buffer(self, handle):
        """Buffer.get_next_combine_buffer of this generation (fast path only)."""
        view = self._current(handle).get_next_combine_buffer(handle)
        if not any(view is v for v in self._views):
            self._views.append(view)
        return view


def _release(inner, collective):
    """Drops a generation's resources now (see _ep_nccl.NcclBuffer.release)."""
    release = getattr(inner, "release", None)
    if release is not None:
        release(collective)
    inner._fast = None
    inner._combine_buffers = {}
