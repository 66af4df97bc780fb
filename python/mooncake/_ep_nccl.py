"""The NCCL device-API (GIN) transport behind ElasticBuffer(transport="nccl"/"auto").

`NcclBuffer` is a `Buffer` whose fast path is the compiled NcclBuffer
(mooncake-ep/torch/nccl, built with USE_NCCL_DEVICE=ON): the argument
checks, handles, events and error reporting are Buffer's, only the setup
and the kernels differ. Setup, on every rank of the group:
  1. group rank 0 makes an NCCL unique id and broadcasts it over the group
     (the application bootstraps nothing);
  2. every rank creates the communicator, the symmetric window (the EP
     buffer plus send staging) and the device communicator with GIN, each
     step bounded by MOONCAKE_EP_SETUP_TIMEOUT_MS;
  3. an all_gather of "ok" makes every rank raise NcclSetupError if any rank
     failed. ElasticBuffer then goes on over IPC/IBGDA when the transport was
     chosen by "auto" (saying why in transport_reason), and re-raises when
     "nccl" was asked for by name.
"""

import os

import torch
import torch.distributed as dist

from mooncake import _ep_fallback as fallback
from mooncake import _ep_fast as fast
from mooncake import _ep_runtime
from mooncake.mooncake_ep_buffer import Buffer

UNIQUE_ID_BYTES = 128


class NcclSetupError(RuntimeError):
    """The NCCL transport could not be set up on some rank (raised on every rank)."""


def broadcast_unique_id(group, rank, make_id, comm_device):
    """Rank 0's NCCL unique id on every rank of `group` (bytes)."""
    if rank == 0:
        uid = make_id()
        if len(uid) != UNIQUE_ID_BYTES:
            raise RuntimeError(f"an NCCL unique id has {len(uid)} bytes, expected "
                               f"{UNIQUE_ID_BYTES}")
        t = torch.frombuffer(bytearray(uid), dtype=torch.uint8).clone()
    else:
        t = torch.zeros(UNIQUE_ID_BYTES, dtype=torch.uint8)
    t = t.to(comm_device)
    dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
    return bytes(t.cpu().tolist())


class NcclBuffer(Buffer):
    """Buffer on the NCCL transport for one ElasticBuffer generation."""

    def __init__(self, group, num_ep_buffer_bytes, topology, num_experts, max_tokens, hidden):
        self.topology = topology
        self._shape_args = (num_experts, max_tokens, hidden)
        super().__init__(group, num_ep_buffer_bytes)

    def _connect(self):
        self._fast, self._device, self._combine_buffers = None, None, {}
        module = _ep_runtime.runtime()
        comm = fallback.comm_device(self.group, torch.device("cpu"))
        uid = broadcast_unique_id(self.group, self.rank, module.nccl_unique_id, comm)
        device = torch.cuda.current_device()
        timeout_ms = int(os.environ.get(fast.SETUP_TIMEOUT_ENV, "30000"))
        num_experts, max_tokens, hidden = self._shape_args
        runtime, error = None, None
        try:
            runtime = module.NcclBuffer(uid, self.rank, self.group_size, device, num_experts,
                                        max_tokens, hidden, timeout_ms)
        except Exception as e:  # noqa: BLE001 - reported to every rank below
            error = f"{type(e).__name__}: {e}"
        bad = fast.ranks_without(error is None, self.group, comm)
        if bad:
            if runtime is not None:
                del runtime  # local teardown: the peers that failed will not finalize
            raise NcclSetupError(
                f"the NCCL device-API transport could not be set up on ranks {bad}"
                + (f" (this rank: {error})" if error else "")
                + "; likely causes: no GIN-capable NIC for peers on other hosts, "
                "NCCL_GIN_ENABLE=0, or no symmetric memory (NCCL_CUMEM_ENABLE=0, or no CUDA "
                "P2P between the GPUs); run with NCCL_DEBUG=WARN for NCCL's own reason, or set "
                "MOONCAKE_EP_TRANSPORT=ibgda or pass transport='ibgda' to use IPC/IBGDA")
        self._fast = runtime
        self._device = torch.device("cuda", device)
        self.use_fast_path = True
        self.fast_path_reason = None

    def release(self, collective):
        """Releases the NCCL resources now (ElasticBuffer calls it).

        collective=True (destroy(): every rank of this generation is here):
        device communicator, window deregistration and ncclCommFinalize, in
        step with the peers. collective=False (update_ep_member(): a rank of
        this generation may be dead and the replacement never joined it):
        local teardown, the communicator is aborted.
        """
        runtime, self._fast = self._fast, None
        if runtime is not None and collective:
            runtime.destroy()
        del runtime  # the destructor aborts whatever destroy() did not release
