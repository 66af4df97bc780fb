"""Mooncake PG: the ``torch.distributed`` backends ``mooncake-cpu`` and ``mooncake``.

Importing this module registers both backends::

    import torch.distributed as dist
    from mooncake import pg

    dist.init_process_group(backend="mooncake-cpu", rank=rank, world_size=world_size)

``mooncake-cpu`` handles CPU tensors. ``mooncake`` is the CUDA backend: CUDA
tensors with NCCL's stream semantics (and CPU tensors, as on mooncake-cpu).
"""

import atexit
import sys
import weakref

from mooncake import _loader

# First, so that a torch version mismatch surfaces as the loader's ImportError.
_lib = _loader.load_versioned("pg", "Mooncake PG")

import torch.distributed as dist  # noqa: E402

MooncakeBackendOptions = _lib.MooncakeBackendOptions
MooncakeProcessGroup = _lib.MooncakeProcessGroup
MooncakeWork = _lib.MooncakeWork

__all__ = [
    "MooncakeBackendOptions",
    "MooncakeProcessGroup",
    "MooncakeWork",
    "activate_ranks",
    "check_graph_replays",
    "deactivate_ranks",
    "extend_group_size_to",
    "get_active_ranks",
    "get_device_filter",
    "get_num_synced_ranks",
    "get_peer_state",
    "get_preferred_hca",
    "join_group",
    "recover_ranks",
    "set_device_filter",
    "set_host_ip",
    "set_transfer_engine",
    "sync_after_failure",
]

# name -> (devices, is_cuda)
_BACKENDS = {
    "mooncake-cpu": (["cpu"], False),
    "mooncake": (["cuda"], True),
}


# Weak references to every group this process created, oldest first.
_groups = []


def _device_backend_map():
    """The {device: backend} map of the init_process_group/new_group call in progress.

    torch does not hand it to the creator; it is a local of the torch
    function that calls the creator. None when that frame is not found.
    """
    import sys

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None or frame.f_code.co_name == "_new_process_group_helper":
            break
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "_new_process_group_helper":
        return None
    config = frame.f_locals.get("backend_config")
    if config is None or not hasattr(config, "get_device_backend_map"):
        return None
    return {str(d): str(b).lower() for d, b in config.get_device_backend_map().items()}


def _mixed_with(own, pg_options):
    """Whether this group also routes a device to a backend other than ``own``.

    torch takes a ProcessGroup returned by a creator as the whole group and
    creates no backend for the other devices, so with a device string such
    as "cpu:mooncake-cpu,cuda:nccl" the creator returns the bare backend for
    torch to register beside the others. Such a group keeps its creation
    size (torch's ProcessGroup), so elastic membership is refused there.
    """
    mapping = _device_backend_map()
    if mapping is None or set(mapping.values()) == {own}:
        return False
    spelled = ",".join(f"{d}:{b}" for d, b in mapping.items())
    if set(mapping.values()) <= set(_BACKENDS):
        raise ValueError(
            f"Mooncake PG: backend='{spelled}' maps devices to both mooncake backends; "
            "write backend='mooncake' instead (it takes CPU and CUDA tensors)")
    if pg_options is not None and isinstance(pg_options, MooncakeBackendOptions) and (
            pg_options.is_extension or pg_options.max_group_size is not None):
        raise ValueError(
            f"Mooncake PG: backend='{spelled}' cannot grow (max_group_size/is_extension in "
            f"pg_options): with several backends torch fixes the group's size. Use "
            f"backend='{own}' alone for elastic membership")
    return True


def _make_creator(name, is_cuda):
    def create(dist_backend_opts, pg_options):
        mixed = _mixed_with(name, pg_options)
        group = _lib.createMooncakeBackend(dist_backend_opts, pg_options, is_cuda)
        _groups[:] = [g for g in _groups if g() is not None]
        _groups.append(weakref.ref(group))
        if mixed:
            return _lib.backend_of(group)
        return group

    # Marks creators as ours, so a re-import recognises its own registration.
    create._mooncake_pg = True
    return create


def _register_backends():
    plugins = getattr(dist.Backend, "_plugins", {})
    for name, (devices, is_cuda) in _BACKENDS.items():
        existing = plugins.get(name.upper())
        if existing is not None:
            if not getattr(existing.creator_fn, "_mooncake_pg", False):
                import warnings

                warnings.warn(
                    f"torch.distributed backend '{name}' is already registered by another "
                    "module; mooncake.pg leaves that registration in place",
                    stacklevel=3,
                )
            continue
        dist.Backend.register_backend(
            name, _make_creator(name, is_cuda), extended_api=True, devices=devices
        )


_register_backends()


class _LiveGroupRanks(dict):
    """A Mooncake group's {global rank: group rank} map that follows its size.

    torch records the map once, at creation; a Mooncake group grows when
    ranks join or are activated, and get_process_group_ranks,
    get_global_rank and get_group_rank read this map. Every read re-derives
    it from the group's current size: an identity map (the default group)
    covers range(size); another map keeps its entries whose group rank is
    below the size.
    """

    def __init__(self, group, ranks):
        super().__init__(ranks)
        import weakref

        self._group = weakref.ref(group)
        self._base = dict(ranks)
        self._identity = all(g == r for g, r in self._base.items()) and sorted(
            self._base) == list(range(len(self._base)))

    def _refresh(self):
        group = self._group()
        if group is None:
            return
        size = group.size()
        if self._identity:
            current = {r: r for r in range(size)}
        else:
            current = {g: r for g, r in self._base.items() if r < size}
        if dict.__len__(self) != len(current) or dict.items(self) != current.items():
            dict.clear(self)
            dict.update(self, current)

    def __getitem__(self, key):
        self._refresh()
        return super().__getitem__(key)

    def __contains__(self, key):
        self._refresh()
        return super().__contains__(key)

    def __iter__(self):
        self._refresh()
        return super().__iter__()

    def __len__(self):
        self._refresh()
        return super().__len__()

    def __repr__(self):
        self._refresh()
        return super().__repr__()

    def get(self, key, default=None):
        self._refresh()
        return super().get(key, default)

    def keys(self):
        self._refresh()
        return super().keys()

    def values(self):
        self._refresh()
        return super().values()

    def items(self):
        self._refresh()
        return super().items()


class _GroupRanksRegistry(dict):
    """torch's registry of group rank maps, wrapping those of Mooncake groups."""

    def __setitem__(self, group, ranks):
        if isinstance(group, MooncakeProcessGroup) and not isinstance(ranks, _LiveGroupRanks):
            ranks = _LiveGroupRanks(group, ranks)
        super().__setitem__(group, ranks)


def _install_group_ranks_registry():
    c10d = dist.distributed_c10d
    current = getattr(c10d, "_pg_group_ranks", None)
    if isinstance(current, _GroupRanksRegistry) or not isinstance(current, dict):
        return
    registry = _GroupRanksRegistry()
    for group, ranks in current.items():
        registry[group] = ranks
    c10d._pg_group_ranks = registry


_install_group_ranks_registry()


def _shutdown_at_exit():
    """Shuts down the groups a script left without ``destroy_process_group()``.

    Otherwise they would go down during interpreter teardown, or not at all:
    their threads would still be polling the store when the process hosting
    it exits (log floods on the other ranks), and a thread that needs the
    GIL once finalization began is stopped in a way that aborts the process.
    Newest first, so subgroups go before the default group; the rank hosting
    the group's Coordinator waits, bounded, for the others to leave, as it
    does in ``destroy_process_group()``. Idempotent with destroy.
    """
    for ref in reversed(_groups):
        group = ref()
        if group is None:
            continue
        try:
            group.shutdown()
        except Exception as e:  # noqa: BLE001 - exiting anyway; say why, once
            print(f"mooncake.pg: shutting a group down at exit failed: {e}", file=sys.stderr)
    _groups.clear()


# Registered after torch.distributed was imported, so this runs before any
# exit hook of torch's own (atexit runs hooks last-registered first).
atexit.register(_shutdown_at_exit)


def set_host_ip(host_ip):
    """Sets the address the backend's listeners bind to.

    Applies to groups created afterwards; call it before
    ``init_process_group()``. Default: ``$MC_HOST_IP`` or ``127.0.0.1``.
    """
    _lib.set_host_ip(str(host_ip))


def set_device_filter(filters):
    """Restricts the NIC/HCA devices the transfer engine may use.

    ``filters`` is a list of device names such as ``["mlx5_1", "mlx5_2"]``.
    Applies to groups created afterwards; call it before
    ``init_process_group()``.
    """
    global _device_filter
    if isinstance(filters, str):
        filters = [f for f in filters.split(",") if f]
    filters = [str(f) for f in filters]
    _lib.set_device_filter(filters)
    _device_filter = filters


_device_filter = []


def get_device_filter():
    """The list :func:`set_device_filter` last set (``[]``: every device).

    EP's IBGDA (``mooncake.mooncake_ep_buffer.Buffer`` across hosts) uses the
    same filter.
    """
    return list(_device_filter)


def get_active_ranks(backend):
    """Returns the group's active-rank mask.

    ``backend`` is a Mooncake process group (``dist.group.WORLD``, a
    ``new_group()`` result, or its ``_get_backend(...)``). The result is an
    ``int32`` tensor with one entry per rank slot (``max_group_size``), 1 for
    active ranks; when ``MooncakeBackendOptions`` was given an
    ``active_ranks`` tensor, that same tensor is returned as the mirror.
    """
    return _lib.get_active_ranks(backend)


def check_graph_replays(backend):
    """Raises the first failure of a collective replayed from a CUDA graph.

    ``backend`` as for :func:`get_active_ranks`. Collectives captured into a
    CUDA graph (``torch.cuda.graph``) run without the host at each replay, so
    their failures cannot raise there: the kernels record the first one (a
    membership change after the capture, which fails every later replay
    without touching a peer; a peer that did not signal within the op's
    timeout; an abort), and this call raises it as ``DistBackendError``,
    naming failed ranks where known, and clears it. Returns ``None`` when no
    replay failed since the last check. Call it after the replays whose
    results you are about to use, e.g. once per decode step.
    """
    _lib.check_graph_replays(backend)


def set_transfer_engine(engine):
    """Makes process groups created afterwards in this process use ``engine``.

    ``engine`` is a :class:`mooncake.engine.TransferEngine` or ``None``. With an
    engine, each new group allocates its windows in it instead of creating an
    engine of its own, and frees them when the group is destroyed. ``None``
    reverts to one engine per group; existing groups keep what they use.

    Every rank of a group must make the same choice, with engines on the same
    store: a mismatch fails ``init_process_group``/``new_group`` on every rank.
    A group holds a reference to its engine, so the engine outlives every group
    that uses it; ``engine.close()`` is refused while such a group exists.
    """
    from mooncake.engine import TransferEngine

    if engine is not None and not isinstance(engine, TransferEngine):
        raise TypeError(
            "mooncake.pg.set_transfer_engine: engine must be a mooncake.engine.TransferEngine "
            f"or None, got {type(engine).__name__}")
    _lib.set_transfer_engine(engine)


def _ranks(ranks):
    if isinstance(ranks, int):
        return [ranks]
    return [int(r) for r in ranks]


def get_num_synced_ranks(backend):
    """Number of rank slots whose processes are synced (locally known, no communication)."""
    return _lib.get_num_synced_ranks(backend)


def get_peer_state(backend, ranks):
    """Per rank in ``ranks``: whether it is ready to be activated.

    A local, best-effort read of the membership mirror; not a collective.
    """
    return list(_lib.get_peer_state(backend, _ranks(ranks)))


def activate_ranks(backend, ranks, timeout=None):
    """Proposes activating ``ranks`` through the Coordinator.

    One call from any online rank suffices; redundant calls are safe. Returns
    once the new view is committed at this rank (``timeout`` in seconds,
    default 60).
    """
    _lib.activate_ranks(backend, _ranks(ranks), timeout)


recover_ranks = activate_ranks


def deactivate_ranks(backend, ranks, timeout=None):
    """Proposes deactivating ``ranks``; their slots stay reserved and nobody is renumbered."""
    _lib.deactivate_ranks(backend, _ranks(ranks), timeout)


def join_group(backend, timeout=None):
    """Joiner side: declares this extension ready and blocks until it is activated.

    Before it returns, collectives on this rank are local-only. ``timeout`` in
    seconds (default 600).
    """
    _lib.join_group(backend, timeout)


def sync_after_failure(backend):
    """Reports this rank's failure evidence, waits for reconciliation, commits the new view.

    Called automatically by failed ops in the default mode. The data plane
    switches to the new view before the next collective.
    """
    _lib.sync_after_failure(backend)


def extend_group_size_to(backend, size):
    """Raises the usable slot count to ``size`` (at most the reserved ``max_group_size``).

    Newly usable slots stay inactive until ``activate_ranks``.
    """
    _lib.extend_group_size_to(backend, int(size))


def get_preferred_hca(backend, location=None):
    """The RDMA devices (HCAs) nearest ``location`` for this group's engine.

    ``location`` is ``"cuda:<n>"`` (nearest by PCIe distance to that GPU),
    ``"cpu:<numa node>"``, ``"cpu"``, or ``None`` for every HCA the device
    filter admits. Empty when the engine has no RDMA device.
    """
    return list(_lib.get_preferred_hca(backend, "" if location is None else str(location)))
