"""Seed 000's IBGDA connect() exchange (mooncake._ep_ibgda) over real groups: with a
stand-in endpoint (which words reach which rank, every rank raising when one cannot
connect), and with the runtime's IbgdaEndpoint over the fake verbs library."""

import os

import harness
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Built by the repo's default build (scripts/build.sh) for the C++ tests.
_FAKE_VERBS = os.path.join(_REPO, "build", "tests", "cpp", "rdma", "libmc_fake_verbs.so")

QPS = 3


class _Endpoint:
    """Words that name their maker and purpose; connect records what it got."""

    qps_per_rank = QPS

    def __init__(self, rank, fail=False):
        self.rank, self.fail, self.got = rank, fail, None

    def region_words(self):
        return (1000 + self.rank, 2000 + self.rank)

    def qp_words_for(self, peer):
        return [self.rank * 100 + peer * 10 + q for q in range(QPS)]

    def gid_words(self):
        return (3000 + self.rank, -4000 - self.rank)

    def connect(self, regions, qps_from, gids):
        self.got = (regions, qps_from, gids)
        if self.fail:
            raise OSError("ibv_modify_qp(RTR) failed: EINVAL")


def _exchange(ctx, failing):
    import torch
    import torch.distributed as dist
    from mooncake import _ep_ibgda

    e = _Endpoint(ctx.rank, fail=ctx.rank in failing)
    try:
        _ep_ibgda.exchange(e, dist.group.WORLD, torch.device("cpu"))
        raised = None
    except RuntimeError as err:
        raised = str(err)
    return {"got": e.got, "raised": raised}


@pytest.mark.parametrize("backend", ["gloo", "mooncake-cpu"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_gets_the_words_meant_for_it(backend, world_size):
    res = harness.run_ranks(_exchange, world_size, backend, timeout_s=120, args=((),),
                            ref_group=False)
    for rank, r in enumerate(res):
        assert r["raised"] is None, (rank, r)
        regions, qps_from, gids = r["got"]
        assert regions == [(1000 + p, 2000 + p) for p in range(world_size)]
        assert gids == [(3000 + p, -4000 - p) for p in range(world_size)]
        # all_to_all: from rank p, the QPs p made for this rank.
        assert qps_from == [[] if p == rank else [p * 100 + rank * 10 + q for q in range(QPS)]
                            for p in range(world_size)], (rank, qps_from)


def test_one_rank_failing_to_connect_fails_every_rank_naming_it():
    res = harness.run_ranks(_exchange, 3, "gloo", timeout_s=120, args=((1,),), ref_group=False)
    for rank, r in enumerate(res):
        assert r["raised"] and "ranks [1] could not connect their IBGDA queue pairs" in r["raised"], \
            (rank, r)
    assert "EINVAL" in res[1]["raised"]


def _runtime_endpoint_class():
    from mooncake import _ep_runtime
    module = _ep_runtime.runtime()
    if module is None or not hasattr(module, "IbgdaEndpoint"):
        pytest.skip(f"this build's EP runtime has no IbgdaEndpoint (needs WITH_RDMA): "
                    f"{_ep_runtime.unavailable_reason() or 'built without RDMA'}")
    return module.IbgdaEndpoint


def test_endpoint_where_no_nic_exists_says_why():
    import ctypes
    cls = _runtime_endpoint_class()
    buf = ctypes.create_string_buffer(4096)
    try:
        e = cls(0, 2, 2, 16, ctypes.addressof(buf), 4096, False)
    except RuntimeError as err:
        assert any(s in str(err) for s in ("no RDMA device", "no IBGDA-capable device",
                                           "the verbs library is missing")), str(err)
        return
    pytest.skip(f"this host has an IBGDA-capable device ({e.device})")


def _runtime_endpoints(ctx):
    import ctypes

    import torch
    import torch.distributed as dist
    from mooncake import _ep_ibgda, _ep_runtime

    buf = ctypes.create_string_buffer(1 << 16)
    e = _ep_runtime.runtime().IbgdaEndpoint(ctx.rank, ctx.world_size, 2, 16,
                                            ctypes.addressof(buf), 1 << 16, False)
    regions, gids = _ep_ibgda.exchange(e, dist.group.WORLD, torch.device("cpu"))
    return {"device": e.device, "mine": list(e.region_words()), "regions": regions.tolist(),
            "gids": gids.tolist(), "qps": [e.qp_words_for(p) for p in range(ctx.world_size)]}


def test_runtime_endpoints_exchange_and_connect_over_the_fake_provider():
    """Each process's IbgdaEndpoint runs on its own copy of the fake provider, so
    the QPs cannot carry data between processes here; creating, exchanging and
    bringing every QP up to RTS through the binding can be shown."""
    _runtime_endpoint_class()
    if not os.path.exists(_FAKE_VERBS):
        pytest.skip(f"the fake verbs library is not built at {_FAKE_VERBS}")
    env = {"MC_RDMA_VERBS_LIBRARY": _FAKE_VERBS, "MC_RDMA_MLX5_LIBRARY": _FAKE_VERBS,
           "MC_FAKE_VERBS_DEVICES": "mlx5_0=active/ib"}
    res = harness.run_ranks(_runtime_endpoints, 3, "gloo", timeout_s=120, env=env,
                            ref_group=False)
    for rank, r in enumerate(res):
        assert r["device"] == "mlx5_0", r
        assert r["regions"] == res[0]["regions"] and r["gids"] == res[0]["gids"], (rank, r)
        assert r["regions"][rank] == r["mine"], (rank, r)
        assert r["qps"][rank] == [] and all(len(q) == 2 for p, q in enumerate(r["qps"]) if p != rank)
