"""torch.distributed conventions the mooncake backends follow.

* An explicit ``timeout=`` to init_process_group/new_group wins over
  MC_PG_TIMEOUT_MS (an environment default for groups created without one);
  ``ProcessGroup.set_timeout`` changes the timeout later ops run under (torch's
  ``_set_pg_timeout`` only handles gloo and nccl).
* Mixed device strings ("cpu:mooncake-cpu,cuda:gloo") route each device to its
  backend; combinations that cannot work fail at init saying what to write.
* After a group grows (join_group), get_process_group_ranks, get_global_rank
  and get_group_rank agree with get_world_size.
* Errors name the backend actually in use ('mooncake' vs 'mooncake-cpu').
"""

import datetime
import time

import pytest
import torch
import torch.distributed as dist

import harness

pytestmark = pytest.mark.skipif(
    not harness.is_mooncake(harness.backend_under_test()),
    reason="these are conventions of the mooncake backends; gloo has its own")

BACKEND = "mooncake-cpu"


def _pg():
    from mooncake import pg
    return pg


def _timeout_ms(group):
    b = group._get_backend(torch.device("cpu"))
    return int(b.timeout.total_seconds() * 1000)


def _recv_error(group):
    # No sender: the recv fails at its deadline, naming the timeout it ran under.
    try:
        dist.recv(torch.zeros(3), src=1, tag=77, group=group)
    except Exception as e:  # noqa: BLE001 - the message is the result
        return str(e)
    return "no error"


def _timeouts(ctx):
    out = {"env_default": _timeout_ms(dist.group.WORLD)}
    explicit = dist.new_group(backend=BACKEND, timeout=datetime.timedelta(seconds=4))
    out["explicit"] = _timeout_ms(explicit)
    if ctx.rank == 0:
        out["explicit_recv"] = _recv_error(explicit)
    dist.barrier(group=ctx.ref)
    explicit.set_timeout(datetime.timedelta(milliseconds=1500))
    out["after_set"] = _timeout_ms(explicit)
    if ctx.rank == 0:
        out["after_set_recv"] = _recv_error(explicit)
    dist.barrier(group=ctx.ref)
    return out


def test_explicit_timeout_wins_over_env_and_set_timeout_applies():
    res = harness.run_ranks(_timeouts, 2, BACKEND, timeout_s=120,
                            env={"MC_PG_TIMEOUT_MS": "3000"})
    for out in res:
        assert out["env_default"] == 3000, out
        assert out["explicit"] == 4000, out
        assert out["after_set"] == 1500, out
    for key, ms in (("explicit_recv", 4000), ("after_set_recv", 1500)):
        msg = res[0][key]
        assert f"timeout {ms} ms" in msg and "TIMEOUT" in msg.upper(), (key, msg)


# --------------------------------------------------------------------------- mixed device strings

def _mixed(ctx, spec):
    ctx.init(backend=spec)
    cpu = dist.group.WORLD._get_backend(torch.device("cpu"))
    cuda = dist.group.WORLD._get_backend(torch.device("cuda"))
    x = torch.full((5,), float(ctx.rank + 1))
    dist.all_reduce(x)
    return type(cpu).__name__, type(cuda).__name__, x.tolist()


def test_mixed_device_string_routes_each_device_to_its_backend():
    spec = "cpu:mooncake-cpu,cuda:gloo"
    res = harness.run_ranks(_mixed, 2, BACKEND, timeout_s=120, init=False, args=(spec,))
    for cpu, cuda, x in res:
        assert cpu == "MooncakeBackend", res
        assert cuda == "ProcessGroupGloo", res
        assert x == [3.0] * 5, res


def _mixed_refused(ctx, spec, with_options):
    kwargs = {}
    if with_options:
        kwargs["pg_options"] = _pg().MooncakeBackendOptions(ctx.world_size + 1)
    ctx.init(backend=spec, **kwargs)


@pytest.mark.parametrize("spec,with_options,pattern", [
    ("cpu:mooncake-cpu,cuda:mooncake", False, r"write backend='mooncake' instead"),
    ("cpu:mooncake-cpu,cuda:gloo", True, r"cannot grow.*Use backend='mooncake-cpu' alone"),
])
def test_mixed_device_strings_that_cannot_work_fail_at_init(spec, with_options, pattern):
    res = harness.run_ranks(_mixed_refused, 2, BACKEND, timeout_s=120, init=False,
                            args=(spec, with_options), expect_fail=r"ValueError.*" + pattern)
    assert all(isinstance(r, harness.RankError) for r in res), res


# --------------------------------------------------------------------------- ranks after growth

def _ranks_view():
    world = dist.group.WORLD
    size = dist.get_world_size()
    return {
        "size": size,
        "ranks": dist.get_process_group_ranks(world),
        "global": [dist.get_global_rank(world, r) for r in range(size)],
        "group": [dist.get_group_rank(world, r) for r in range(size)],
    }


def _grow(ctx):
    pg = _pg()
    seen = {}
    if ctx.rank < 2:
        ctx.init(world_size=2, pg_options=pg.MooncakeBackendOptions(3, False))
        ctx.signal("founders_up")
        seen["before"] = _ranks_view()
        deadline = time.monotonic() + 60
        while not all(pg.get_peer_state(dist.group.WORLD, [2])):
            assert time.monotonic() < deadline, "rank 2 never became ready"
            time.sleep(0.01)
        if ctx.rank == 0:
            pg.activate_ranks(dist.group.WORLD, [2])
        while pg.get_active_ranks(dist.group.WORLD).tolist() != [1, 1, 1]:
            assert time.monotonic() < deadline, pg.get_active_ranks(dist.group.WORLD)
            time.sleep(0.01)
    else:
        ctx.wait_for("founders_up", 60)
        ctx.init(rank=2, world_size=3, pg_options=pg.MooncakeBackendOptions(3, True))
        seen["before"] = _ranks_view()
        pg.join_group(dist.group.WORLD, timeout=60)
    x = torch.ones(2)
    dist.all_reduce(x)
    seen["sum"] = x.tolist()
    seen["after"] = _ranks_view()
    return seen


def test_group_rank_queries_follow_a_join():
    res = harness.run_ranks(_grow, 3, BACKEND, timeout_s=180, init=False, ref_group=False,
                            env={"MC_PG_RECONCILE_WINDOW_MS": "4000"})
    for rank, seen in enumerate(res):
        before = seen["before"]
        assert before["ranks"] == list(range(before["size"])) == [0, 1], (rank, seen)
        assert seen["sum"] == [3.0, 3.0], (rank, seen)
        after = seen["after"]
        assert after["size"] == 3, (rank, seen)
        assert after["ranks"] == [0, 1, 2], (rank, seen)
        assert after["global"] == [0, 1, 2] and after["group"] == [0, 1, 2], (rank, seen)


# --------------------------------------------------------------------------- backend names

def _meta_tensor(ctx, backend):
    ctx.init(backend=backend)
    try:
        dist.all_reduce(torch.empty(2, device="meta"))
    except Exception as e:  # noqa: BLE001
        return str(e)
    return "no error"


@pytest.mark.parametrize("backend", ["mooncake", "mooncake-cpu"])
def test_errors_name_the_backend_in_use(backend):
    res = harness.run_ranks(_meta_tensor, 2, BACKEND, timeout_s=120, init=False,
                            ref_group=False, args=(backend,))
    for msg in res:
        assert f"backend '{backend}'" in msg, msg
        other = "mooncake-cpu" if backend == "mooncake" else "'mooncake'"
        assert other not in msg, msg
