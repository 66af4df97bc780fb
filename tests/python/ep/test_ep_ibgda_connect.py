"""How a fast-path Buffer whose ranks span hosts connects (mooncake._ep_fast.connect with
`hosts`): peers on the rank's host are mapped over cuda_ipc, the others reached over
IBGDA through an IbgdaLink per rank, exchanged in seed 000's order over the group,
activated and attached. Run over real gloo groups with a stand-in runtime module (no
GPU or NIC here), so what is checked is the protocol: which peers each rank maps, that
every link connects to the words meant for it, and that a failure on one rank gives
every rank the same reason naming it."""

import harness
import pytest

QPS = 2


class _Fast:
    """The runtime Buffer's surface that connect uses."""

    def __init__(self, rank):
        self.rank, self.p2p, self.link = rank, None, None

    def local_address(self):
        return 0x10000 * (self.rank + 1)

    def connect(self, addresses, p2p):
        self.addresses, self.p2p = list(addresses), list(p2p)

    def set_direct_dispatch(self, on):
        self.direct = on


class _Link:
    qps_per_rank = QPS

    def __init__(self, module, rank, num_ranks, buffer, num_bytes):
        self.module, self.rank, self.buffer = module, rank, buffer
        self.num_bytes, self.got, self.active = num_bytes, None, False

    def region_words(self):
        return (self.buffer, 500 + self.rank)

    def qp_words_for(self, peer):
        return [self.rank * 100 + peer * 10 + q for q in range(QPS)]

    def gid_words(self):
        return (7, 8 + self.rank)

    def connect(self, regions, qps_from, gids):
        self.got = (regions, qps_from, gids)

    def activate(self):
        if self.module.fail == "activate":
            raise RuntimeError("IBGDA link: cudaHostRegister failed")
        self.active = True


class _Module:
    def __init__(self, rank, fail):
        self.rank, self.fail, self.links = rank, fail, []

    def Buffer(self, store, prefix, secret, rank, num_ranks, num_bytes, device, timeout_ms,
               ranks_per_device):
        return _Fast(rank)

    def IbgdaLink(self, rank, num_ranks, buffer, num_bytes, device_filter):
        self.device_filter = device_filter
        if self.fail == "create":
            raise RuntimeError("no IBGDA-capable device: mlx5_0 has no ACTIVE port")
        self.links.append(_Link(self, rank, num_ranks, buffer, num_bytes))
        return self.links[-1]

    def attach_ibgda(self, fast, link):
        fast.link = link


def _connect(ctx, hosts, failing):
    import torch
    import torch.distributed as dist
    from mooncake import _ep_fast, _ep_runtime

    from mooncake import pg
    pg.set_device_filter(["mlx5_3"])  # the links must be made on the filter's devices
    fail = failing.get(ctx.rank)
    module = _Module(ctx.rank, fail)
    _ep_runtime.runtime = lambda: module
    torch.cuda.current_device = lambda: 0
    fast, reason = _ep_fast.connect(dist.group.WORLD, ctx.rank, ctx.world_size, 4096, 0x1234,
                                    torch.device("cpu"), hosts=hosts)
    out = {"ok": fast is not None, "reason": reason, "links": len(module.links),
           "filter": getattr(module, "device_filter", None)}
    if fast is not None:
        link = fast.link
        out.update(p2p=fast.p2p, active=link.active if link else None,
                   got=link.got if link else None)
    return out


def test_single_host_maps_every_peer_and_makes_no_link():
    res = harness.run_ranks(_connect, 2, "gloo", timeout_s=120, args=(None, {}),
                            ref_group=False)
    for r in res:
        assert r["ok"] and r["reason"] is None, r
        assert r["p2p"] == [] and r["links"] == 0 and r["got"] is None, r


def test_ranks_on_two_hosts_map_their_host_and_link_the_rest():
    hosts = [11, 11, 22]
    res = harness.run_ranks(_connect, 3, "gloo", timeout_s=120, args=(hosts, {}),
                            ref_group=False)
    for rank, r in enumerate(res):
        assert r["ok"] and r["reason"] is None, (rank, r)
        assert r["p2p"] == [h == hosts[rank] for h in hosts], (rank, r)
        assert r["links"] == 1 and r["active"] and r["filter"] == ["mlx5_3"], (rank, r)
        regions, qps_from, gids = r["got"]
        assert regions == [(0x10000 * (p + 1), 500 + p) for p in range(3)]
        assert qps_from == [[] if p == rank else [p * 100 + rank * 10 + q for q in range(QPS)]
                            for p in range(3)], (rank, qps_from)
        assert gids == [(7, 8 + p) for p in range(3)]


@pytest.mark.parametrize("stage,what", [
    ("create", "could not set up IBGDA (queue pairs, registration)"),
    ("activate", "could not map their IBGDA queues into the GPU"),
])
def test_one_rank_failing_gives_every_rank_the_reason_naming_it(stage, what):
    res = harness.run_ranks(_connect, 3, "gloo", timeout_s=120,
                            args=([11, 22, 22], {1: stage}), ref_group=False)
    for rank, r in enumerate(res):
        assert not r["ok"], (rank, r)
        assert r["reason"].startswith(f"ranks [1] {what}"), (rank, r)
    assert "(this rank: RuntimeError: " in res[1]["reason"], res[1]
    assert "this rank" not in res[0]["reason"]


def test_runtime_link_where_no_nic_exists_says_why():
    import ctypes

    from mooncake import _ep_runtime
    module = _ep_runtime.runtime()
    if module is None or not hasattr(module, "IbgdaLink"):
        pytest.skip(f"this build's EP runtime has no IbgdaLink (needs WITH_RDMA): "
                    f"{_ep_runtime.unavailable_reason() or 'built without RDMA'}")
    buf = ctypes.create_string_buffer(4096)
    try:
        link = module.IbgdaLink(0, 2, ctypes.addressof(buf), 4096, buffer_on_device=False)
    except RuntimeError as err:
        # The probe answers before any CUDA call: the same reason with or without a GPU.
        assert any(s in str(err) for s in ("no RDMA device", "no IBGDA-capable device",
                                           "the verbs library is missing")), str(err)
        return
    pytest.skip(f"this host has an IBGDA-capable device ({link.device})")


def _missing(ctx, capable):
    import torch
    import torch.distributed as dist
    from mooncake import _ep_runtime
    from mooncake.mooncake_ep_buffer import Buffer

    buf = Buffer(dist.group.WORLD, 0)  # the fallback here; only its group is used
    if ctx.rank in capable:  # as if this rank's probe had found a device
        _ep_runtime.ibgda_device = lambda: "mlx5_0"
    return buf._ibgda_missing([5, 6], torch.device("cpu"))


@pytest.mark.parametrize("capable,without", [((), [0, 1]), ((1,), [0]), ((0, 1), None)])
def test_buffer_across_hosts_needs_ibgda_on_every_rank(capable, without):
    res = harness.run_ranks(_missing, 2, "gloo", timeout_s=120, args=(capable,),
                            ref_group=False)
    for rank, reason in enumerate(res):
        if without is None:
            assert reason is None, (rank, reason)
            continue
        assert reason.startswith(f"the ranks are on 2 hosts; the fast path reaches other hosts "
                                 f"over IBGDA, which ranks {without} cannot use (this rank: "), \
            (rank, reason)
