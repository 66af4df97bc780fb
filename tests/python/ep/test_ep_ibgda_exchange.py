"""Seed 000's IBGDA connect() exchange (mooncake._ep_ibgda) over real groups, with a
stand-in endpoint: which words reach which rank, in which order, and every rank
raising when one cannot connect."""

import harness
import pytest

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
