"""Seed 000's connect() exchange for EP over IBGDA, run over the Buffer's group.

Every rank of `group` calls exchange(endpoint, group, device) with its own
endpoint: the C++ IbgdaEndpoint (mooncake-ep/ibgda/endpoint.h), or any
object with the same methods. The words travel in the seed's order:

  1. all_gather   endpoint.region_words()     (raddr, rkey) of the buffer
  2. all_to_all   endpoint.qp_words_for(p)    the QPs this rank made for p
  3. all_gather   endpoint.gid_words()        GID subnet prefix, interface id

then endpoint.connect(regions, qps_from, gids) brings the QPs up, and a last
all_gather (the peer sync) tells every rank whether every rank connected, so
all of them return or all raise, naming the ranks that failed. A Buffer
whose ranks span hosts runs it on its IbgdaLink (_ep_fast.connect_ibgda).
"""

import torch
import torch.distributed as dist

from mooncake._ep_fast import _all_gather_ints as _all_gather_rows
from mooncake._ep_fast import ranks_without


def exchange(endpoint, group, device):
    """Runs the exchange and connects `endpoint`; RuntimeError on every rank if any failed."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    qps = int(endpoint.qps_per_rank)
    regions = _all_gather_rows(list(endpoint.region_words()), group, device)
    send = torch.zeros(n, qps, dtype=torch.int64)
    for p in range(n):
        if p != rank:
            words = list(endpoint.qp_words_for(p))
            if len(words) != qps:
                raise ValueError(f"qp_words_for({p}) gave {len(words)} words; expected "
                                 f"qps_per_rank={qps}")
            send[p] = torch.tensor(words, dtype=torch.int64)
    recv = torch.empty_like(send).to(device)
    # Row p of what this rank receives is what rank p made for it.
    dist.all_to_all_single(recv, send.to(device), group=group)
    recv = recv.cpu()
    gids = _all_gather_rows(list(endpoint.gid_words()), group, device)
    error = None
    try:
        endpoint.connect([tuple(r) for r in regions.tolist()],
                         [recv[p].tolist() if p != rank else [] for p in range(n)],
                         [tuple(g) for g in gids.tolist()])
    except Exception as e:  # noqa: BLE001 - reported to every rank below
        error = f"{type(e).__name__}: {e}"
    bad = ranks_without(error is None, group, device)
    if bad:
        raise RuntimeError(f"Mooncake EP: ranks {bad} could not connect their IBGDA queue pairs"
                           + (f" (this rank: {error})" if error else ""))
    return regions, gids
