"""Mooncake PG: the ``torch.distributed`` backends ``mooncake-cpu`` and ``mooncake``.

Importing this module registers both backends::

    import torch.distributed as dist
    from mooncake import pg

    dist.init_process_group(backend="mooncake-cpu", rank=rank, world_size=world_size)

``mooncake-cpu`` handles CPU tensors. ``mooncake`` is the CUDA backend; its
CUDA data path is not available yet, so CUDA tensors are rejected with an
explanation.
"""

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
    "get_active_ranks",
    "set_device_filter",
    "set_host_ip",
]

# name -> (devices, is_cuda)
_BACKENDS = {
    "mooncake-cpu": (["cpu"], False),
    "mooncake": (["cuda"], True),
}


def _make_creator(is_cuda):
    def create(dist_backend_opts, pg_options):
        return _lib.createMooncakeBackend(dist_backend_opts, pg_options, is_cuda)

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
            name, _make_creator(is_cuda), extended_api=True, devices=devices
        )


_register_backends()


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
    if isinstance(filters, str):
        filters = [f for f in filters.split(",") if f]
    _lib.set_device_filter([str(f) for f in filters])


def get_active_ranks(backend):
    """Returns the group's active-rank mask.

    ``backend`` is a Mooncake process group (``dist.group.WORLD``, a
    ``new_group()`` result, or its ``_get_backend(...)``). The result is an
    ``int32`` tensor with one entry per rank slot (``max_group_size``), 1 for
    active ranks; when ``MooncakeBackendOptions`` was given an
    ``active_ranks`` tensor, that same tensor is returned as the mirror.
    """
    return _lib.get_active_ranks(backend)
