"""Which transport an ElasticBuffer uses: NCCL's device API (GIN) or IPC/IBGDA.

Everything here is a pure function of what the ranks reported (their host,
CUDA device, NCCL versions and requested transport), so every rank computes
the same answer from the same all-gathered table, and the whole decision
matrix is unit-tested without GPUs (tests/python/ep/test_ep_transport.py).

Rules (docs/ep-elastic-buffer.md):
  * ``transport`` is "auto", "ibgda" or "nccl"; with "auto",
    MOONCAKE_EP_TRANSPORT (same values) overrides it, for staged rollouts.
  * "ibgda" always uses the IPC/IBGDA machinery of ``Buffer``.
  * "nccl" uses NCCL or fails with the reason (no fallback).
  * "auto" uses NCCL when it is usable, else IPC/IBGDA, and records why.
NCCL is usable when the extension was built with USE_NCCL_DEVICE against
NCCL >= NCCL_MIN_VERSION, the libnccl loaded at run time is the very version
of the build's headers, every rank has its own GPU, and the ranks form
contiguous, equal-size teams of one host each (num_ranks = num_rdma_ranks x
num_nvlink_ranks) whose shape the kernels are compiled for.
"""

import os

TRANSPORTS = ("auto", "ibgda", "nccl")
TRANSPORT_ENV = "MOONCAKE_EP_TRANSPORT"

# (num_rdma_ranks, num_nvlink_ranks) the NCCL kernels are compiled for.
NCCL_SHAPES = ((1, 2), (1, 8), (2, 4), (2, 8), (4, 4))

# The NCCL device API this code was written and reviewed against (2.28.9, the
# version of our machines). The upstream text names 2.30.4; we gate on what
# the build actually found instead, and refuse anything older than this.
NCCL_MIN_VERSION = 22809


def nccl_version_string(code):
    """NCCL_VERSION_CODE (major * 10000 + minor * 100 + patch) as "2.28.9"."""
    if code <= 0:
        return "none"
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def parse_transport(value, what="transport"):
    """The transport name, or ValueError naming the value and the accepted ones."""
    if not isinstance(value, str) or value.strip().lower() not in TRANSPORTS:
        raise ValueError(
            f"{what} must be one of {', '.join(repr(t) for t in TRANSPORTS)}, got {value!r}")
    return value.strip().lower()


def requested_transport(transport, environ=None):
    """(mode, source): the mode this rank asks for and where it came from.

    The environment variable only overrides "auto": an explicit argument is
    the caller's decision. An empty variable counts as unset.
    """
    mode = parse_transport(transport)
    environ = os.environ if environ is None else environ
    env = environ.get(TRANSPORT_ENV, "")
    if mode == "auto" and env.strip():
        return parse_transport(env, f"the environment variable {TRANSPORT_ENV}"), TRANSPORT_ENV
    return mode, "argument"


def infer_topology(hosts, devices, shapes=NCCL_SHAPES):
    """(num_rdma_ranks, num_nvlink_ranks, reason): reason is None when NCCL can use it.

    `hosts[r]` and `devices[r]` are rank r's host id and the id of its GPU
    (_ep_fast.device_id: from the GPU's UUID, so ordinals that differ under
    per-process CUDA_VISIBLE_DEVICES do not matter; -1: none);
    `shapes` are the (num_rdma_ranks, num_nvlink_ranks) with compiled kernels.
    """
    num_ranks = len(hosts)
    no_gpu = [r for r, d in enumerate(devices) if d < 0]
    if no_gpu:
        return 0, 0, f"ranks {no_gpu} have no CUDA device"
    seen = {}
    for r, key in enumerate(zip(hosts, devices)):
        if key in seen:
            return 0, 0, (f"ranks {seen[key]} and {r} share one CUDA device on one host; "
                          f"NCCL needs one GPU per rank")
        seen[key] = r
    # Teams: maximal runs of consecutive ranks on one host.
    runs = []
    for r, host in enumerate(hosts):
        if runs and runs[-1][0] == host:
            runs[-1][1] += 1
        else:
            runs.append([host, 1])
    if len({host for host, _ in runs}) != len(runs):
        return 0, 0, ("the ranks of a host are not contiguous in the group; NCCL LSA teams "
                      "must be contiguous rank ranges")
    sizes = [n for _, n in runs]
    if len(set(sizes)) != 1:
        return 0, 0, f"the hosts hold {sizes} ranks; NCCL LSA teams must be of equal size"
    shape = (len(runs), sizes[0])
    assert shape[0] * shape[1] == num_ranks
    if shape not in shapes:
        supported = ", ".join(f"{a}x{b}" for a, b in shapes)
        return shape[0], shape[1], (f"topology {shape[0]}x{shape[1]} (num_rdma_ranks x "
                                    f"num_nvlink_ranks) has no compiled NCCL kernel; "
                                    f"supported: {supported}")
    return shape[0], shape[1], None


def nccl_build_reason(built_version, runtime_version):
    """None when this rank's build and runtime can run the NCCL transport, else why not."""
    if built_version <= 0:
        return ("this Mooncake EP build has no NCCL device-API transport (build with "
                "-DUSE_NCCL_DEVICE=ON)")
    if built_version < NCCL_MIN_VERSION:
        return (f"built against NCCL {nccl_version_string(built_version)}; the device-API "
                f"transport needs NCCL >= {nccl_version_string(NCCL_MIN_VERSION)}")
    if runtime_version != built_version:
        return (f"the loaded libnccl is {nccl_version_string(runtime_version)} but Mooncake was "
                f"built with NCCL {nccl_version_string(built_version)} headers; they must match "
                f"exactly (rebuild Mooncake after an NCCL upgrade)")
    return None


class Resolution:
    """The outcome: `transport` ("nccl" or "ibgda"), `requested`, and `reason`.

    `reason` says why NCCL is not used (None when it is); `shape` is the
    (num_rdma_ranks, num_nvlink_ranks) found, (0, 0) when none was.
    """

    __slots__ = ("transport", "requested", "reason", "shape")

    def __init__(self, transport, requested, reason, shape):
        self.transport, self.requested = transport, requested
        self.reason, self.shape = reason, shape

    def __repr__(self):
        return (f"Resolution(transport={self.transport!r}, requested={self.requested!r}, "
                f"reason={self.reason!r}, shape={self.shape})")


def resolve(requests, hosts, devices, built_versions, runtime_versions, shapes=NCCL_SHAPES):
    """The transport of the group, from every rank's report (rank order).

    `requests[r]` is rank r's (mode, source) from requested_transport(). The
    ranks must ask for the same mode. Raises RuntimeError when "nccl" was
    requested and NCCL is not usable.
    """
    modes = [m for m, _ in requests]
    if len(set(modes)) != 1:
        detail = ", ".join(f"rank {r}: {m!r} ({src})" for r, (m, src) in enumerate(requests))
        raise ValueError(f"the ranks ask for different EP transports ({detail}); every rank "
                         f"must pass the same transport and {TRANSPORT_ENV}")
    mode = modes[0]
    if mode == "ibgda":
        return Resolution("ibgda", mode, f"transport 'ibgda' was requested "
                          f"({requests[0][1]})", (0, 0))
    reason = None
    for r, (built, loaded) in enumerate(zip(built_versions, runtime_versions)):
        why = nccl_build_reason(built, loaded)
        if why is not None:
            reason = f"rank {r}: {why}"
            break
    rdma, nvlink, topo_reason = infer_topology(hosts, devices, shapes)
    if reason is None:
        reason = topo_reason
    if reason is None:
        return Resolution("nccl", mode, None, (rdma, nvlink))
    if mode == "nccl":
        raise RuntimeError(f"transport 'nccl' was requested ({requests[0][1]}) but NCCL cannot "
                           f"be used: {reason}; pass transport='auto' or 'ibgda' to use "
                           f"IPC/IBGDA")
    return Resolution("ibgda", mode, reason, (rdma, nvlink))
