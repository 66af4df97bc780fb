"""Finds the compiled EP runtime (the CUDA fast path), if this build has one.

The runtime is the extension module ``mooncake.ep_<torch version>``. Builds
without it (today: every build) still get the Python API, which then runs the
collective fallback; ``unavailable_reason()`` says why the fast path is off.
"""

import logging
import sys
import warnings

import torch

from mooncake import _loader

_state = None  # (module or None, reason or None), filled on first use


def _load():
    global _state
    if _state is not None:
        return _state
    try:
        module = _loader.load_versioned("ep", "Mooncake EP runtime")
    except ImportError as e:
        _state = (None, f"the compiled EP runtime is not available ({e})")
        if _loader.built_versions("ep"):
            # Runtimes exist, just not for this torch: likely an environment
            # mix-up the user wants to hear about, not only a slow fallback.
            warnings.warn(_state[1], RuntimeWarning, stacklevel=3)
        return _state
    if not hasattr(module, "Buffer"):
        # A module from a build that carries only the version stamp.
        _state = (None, f"{module.__name__} has no fast-path Buffer in this build")
        return _state
    _state = (module, None)
    return _state


def runtime():
    """The compiled runtime module, or None."""
    return _load()[0]


def unavailable_reason(device=None):
    """None when the fast path can run on `device`, else a sentence saying why not."""
    module, reason = _load()
    if module is None:
        return reason
    if device is not None and torch.device(device).type != "cuda":
        return f"the fast path moves CUDA tensors only; this buffer's data is on {device}"
    if not torch.cuda.is_available():
        return "the fast path needs CUDA and torch.cuda.is_available() is False"
    return None


def nccl_versions():
    """(built, loaded): the NCCL_VERSION_CODE of the headers the NCCL device-API
    transport was built with and of the libnccl loaded now; (0, 0) in builds
    without it (USE_NCCL_DEVICE=OFF, or no runtime at all)."""
    module = runtime()
    built = int(getattr(module, "NCCL_DEVICE_VERSION", 0)) if module is not None else 0
    if built <= 0:
        return 0, 0
    return built, int(module.nccl_runtime_version())


def nccl_shapes():
    """The (num_rdma_ranks, num_nvlink_ranks) shapes the built NCCL kernels cover."""
    module = runtime()
    shapes = getattr(module, "NCCL_SHAPES", ()) if module is not None else ()
    return tuple(tuple(int(v) for v in s) for s in shapes)


_ibgda = None  # {device filter: (device, sentence)}, filled on first use


def device_filter():
    """The RDMA device filter of mooncake.pg.set_device_filter (``[]``: any device).

    Read from mooncake.pg only if the program imported it: EP does not load
    the PG library for this.
    """
    pg = sys.modules.get("mooncake.pg")
    return list(pg.get_device_filter()) if pg is not None else []


def _probe_ibgda():
    global _ibgda
    if _ibgda is None:
        _ibgda = {}
    key = tuple(device_filter())
    if key not in _ibgda:
        module = runtime()
        if module is None or not hasattr(module, "ibgda_status"):
            found = ("", "IBGDA is unavailable: " +
                     (_load()[1] or "this runtime has no IBGDA probe"))
        elif not hasattr(module, "IbgdaLink"):
            found = ("", "IBGDA is unavailable: this runtime was built without RDMA "
                         "(WITH_RDMA=OFF)")
        else:
            device, reason = module.ibgda_status(list(key))
            found = (device, f"IBGDA-capable device {device}" if device else
                     f"IBGDA is unavailable: {reason}")
        _ibgda[key] = found
        logging.getLogger("mooncake.ep").info("Mooncake EP: %s", found[1])
    return _ibgda[key]


def ibgda_device():
    """The device EP would drive with GPU-initiated RDMA (IBGDA), or "".

    Asked once per process and device filter (the probe opens the devices;
    the filter is mooncake.pg.set_device_filter's); the answer is logged once
    at INFO on the ``mooncake.ep`` logger.
    """
    return _probe_ibgda()[0]


def ibgda_reason():
    """What the IBGDA probe found, as a sentence: "IBGDA-capable device mlx5_0",
    or "IBGDA is unavailable: <why>"."""
    return _probe_ibgda()[1]
