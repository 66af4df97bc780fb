"""The ElasticBuffer transport decision (mooncake._ep_transport), the whole matrix, no GPU."""

import pytest

from mooncake import _ep_transport as tr

V = tr.NCCL_MIN_VERSION  # a build and runtime that can run the NCCL transport


def _one_host(n, host=7):
    return [host] * n, list(range(n))


def _hosts(num_rdma, num_nvlink):
    hosts = [h for h in range(num_rdma) for _ in range(num_nvlink)]
    devices = [d for _ in range(num_rdma) for d in range(num_nvlink)]
    return hosts, devices


def _resolve(mode, hosts, devices, built=V, loaded=V, source="argument"):
    n = len(hosts)
    return tr.resolve([(mode, source)] * n, hosts, devices, [built] * n, [loaded] * n)


@pytest.mark.parametrize("shape", tr.NCCL_SHAPES)
def test_auto_picks_nccl_for_every_compiled_shape(shape):
    res = _resolve("auto", *_hosts(*shape))
    assert (res.transport, res.reason, res.shape) == ("nccl", None, shape)


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (2, 2), (3, 2), (1, 3), (4, 8), (8, 1), (2, 1)])
def test_auto_picks_ibgda_for_other_shapes(shape):
    res = _resolve("auto", *_hosts(*shape))
    assert res.transport == "ibgda"
    assert res.reason == (f"topology {shape[0]}x{shape[1]} (num_rdma_ranks x num_nvlink_ranks) "
                          f"has no compiled NCCL kernel; supported: 1x2, 1x8, 2x4, 2x8, 4x4")


@pytest.mark.parametrize("shape", [(1, 4), (3, 2)])
def test_nccl_on_an_unsupported_shape_is_an_error(shape):
    with pytest.raises(RuntimeError, match=rf"transport 'nccl' was requested \(argument\) but NCCL "
                       rf"cannot be used: topology {shape[0]}x{shape[1]} .*pass transport='auto' "
                       rf"or 'ibgda'"):
        _resolve("nccl", *_hosts(*shape))


def test_nccl_when_usable():
    res = _resolve("nccl", *_hosts(2, 4))
    assert (res.transport, res.requested, res.shape) == ("nccl", "nccl", (2, 4))


def test_ibgda_is_forced_even_where_nccl_could_run():
    res = _resolve("ibgda", *_hosts(1, 8))
    assert res.transport == "ibgda" and res.reason == "transport 'ibgda' was requested (argument)"


def test_several_ranks_on_one_gpu_auto_falls_back_and_nccl_refuses():
    hosts, devices = [3] * 8, [0] * 8  # 8 processes on one GPU (the one-GPU machine)
    res = _resolve("auto", hosts, devices)
    assert res.transport == "ibgda"
    assert res.reason == ("ranks 0 and 1 share one CUDA device on one host; NCCL needs one GPU "
                          "per rank")
    with pytest.raises(RuntimeError, match="ranks 0 and 1 share one CUDA device"):
        _resolve("nccl", hosts, devices)
    # Two GPUs, two ranks each: still shared.
    res = _resolve("auto", [3, 3, 3, 3], [0, 1, 0, 1])
    assert res.reason.startswith("ranks 0 and 2 share one CUDA device")


def test_ranks_without_a_gpu():
    res = _resolve("auto", [1, 1], [0, -1])
    assert res.transport == "ibgda" and res.reason == "ranks [1] have no CUDA device"


def test_teams_must_be_contiguous_and_equal():
    res = _resolve("auto", [1, 2, 1, 2], [0, 0, 1, 1])
    assert res.reason.startswith("the ranks of a host are not contiguous")
    res = _resolve("auto", [1, 1, 1, 2, 2, 2, 2, 2], [0, 1, 2, 0, 1, 2, 3, 4])
    assert res.reason == "the hosts hold [3, 5] ranks; NCCL LSA teams must be of equal size"


def test_missing_nccl_build():
    res = _resolve("auto", *_hosts(1, 8), built=0, loaded=0)
    assert res.transport == "ibgda"
    assert res.reason == ("rank 0: this Mooncake EP build has no NCCL device-API transport "
                          "(build with -DUSE_NCCL_DEVICE=ON)")
    with pytest.raises(RuntimeError, match=r"no NCCL device-API transport"):
        _resolve("nccl", *_hosts(1, 8), built=0, loaded=0)


def test_version_gate():
    old = tr.NCCL_MIN_VERSION - 1  # 2.28.8
    res = _resolve("auto", *_hosts(1, 2), built=old, loaded=old)
    assert res.transport == "ibgda"
    assert res.reason == ("rank 0: built against NCCL 2.28.8; the device-API transport needs "
                          "NCCL >= 2.28.9")
    # Newer NCCL is accepted, as long as headers and library agree.
    assert _resolve("auto", *_hosts(1, 2), built=23004, loaded=23004).transport == "nccl"
    res = _resolve("auto", *_hosts(1, 2), built=22809, loaded=23004)
    assert res.reason == ("rank 0: the loaded libnccl is 2.30.4 but Mooncake was built with NCCL "
                          "2.28.9 headers; they must match exactly (rebuild Mooncake after an "
                          "NCCL upgrade)")
    with pytest.raises(RuntimeError, match=r"the loaded libnccl is 2\.30\.4"):
        _resolve("nccl", *_hosts(1, 2), built=22809, loaded=23004)


def test_one_rank_without_nccl_decides_for_all():
    n = 8
    hosts, devices = _hosts(1, n)
    built = [V] * n
    built[5] = 0
    res = tr.resolve([("auto", "argument")] * n, hosts, devices, built, [V] * 5 + [0] + [V] * 2)
    assert res.transport == "ibgda" and res.reason.startswith("rank 5: this Mooncake EP build")


def test_env_overrides_auto_only():
    assert tr.requested_transport("auto", {}) == ("auto", "argument")
    assert tr.requested_transport("auto", {tr.TRANSPORT_ENV: ""}) == ("auto", "argument")
    env = tr.TRANSPORT_ENV
    assert tr.requested_transport("auto", {env: "ibgda"}) == ("ibgda", env)
    assert tr.requested_transport("auto", {env: " NCCL "}) == ("nccl", env)
    assert tr.requested_transport("auto", {tr.TRANSPORT_ENV: "auto"}) == ("auto", tr.TRANSPORT_ENV)
    # An explicit argument is the caller's decision.
    assert tr.requested_transport("nccl", {tr.TRANSPORT_ENV: "ibgda"}) == ("nccl", "argument")
    assert tr.requested_transport("ibgda", {tr.TRANSPORT_ENV: "nccl"}) == ("ibgda", "argument")
    # The source appears in the outcome.
    n = 4
    res = tr.resolve([("ibgda", tr.TRANSPORT_ENV)] * n, *_hosts(1, 4), [V] * n, [V] * n)
    assert res.reason == f"transport 'ibgda' was requested ({tr.TRANSPORT_ENV})"
    with pytest.raises(RuntimeError, match=rf"requested \({tr.TRANSPORT_ENV}\)"):
        tr.resolve([("nccl", tr.TRANSPORT_ENV)] * n, *_hosts(1, 4), [V] * n, [V] * n)


def test_env_override_selects_nccl_only_where_usable():
    res = tr.resolve([("auto", "argument")] * 2, *_hosts(1, 2), [V] * 2, [V] * 2)
    assert res.transport == "nccl"
    mode = tr.requested_transport("auto", {tr.TRANSPORT_ENV: "ibgda"})
    assert tr.resolve([mode] * 2, *_hosts(1, 2), [V] * 2, [V] * 2).transport == "ibgda"


@pytest.mark.parametrize("bad", ["", "NCCLX", "ib", "ipc", None, 3, "auto,nccl"])
def test_bad_strings(bad):
    with pytest.raises(ValueError) as err:
        tr.requested_transport(bad, {})
    assert str(err.value) == f"transport must be one of 'auto', 'ibgda', 'nccl', got {bad!r}"


def test_bad_environment_value():
    with pytest.raises(ValueError) as err:
        tr.requested_transport("auto", {tr.TRANSPORT_ENV: "rdma"})
    assert str(err.value) == (f"the environment variable {tr.TRANSPORT_ENV} must be one of "
                              f"'auto', 'ibgda', 'nccl', got 'rdma'")


def test_ranks_must_agree_on_the_request():
    with pytest.raises(ValueError, match=r"different EP transports \(rank 0: 'auto' \(argument\), "
                       rf"rank 1: 'ibgda' \({tr.TRANSPORT_ENV}\)\)"):
        tr.resolve([("auto", "argument"), ("ibgda", tr.TRANSPORT_ENV)], *_hosts(1, 2), [V] * 2,
                   [V] * 2)


def test_version_strings():
    assert tr.nccl_version_string(22809) == "2.28.9"
    assert tr.nccl_version_string(23004) == "2.30.4"
    assert tr.nccl_version_string(0) == "none"


def test_a_build_with_fewer_compiled_shapes():
    # A build whose kernels cover only single-team shapes: 2x4 goes to IPC/IBGDA.
    only = ((1, 2), (1, 8))
    n = 8
    res = tr.resolve([("auto", "argument")] * n, *_hosts(2, 4), [V] * n, [V] * n, shapes=only)
    assert res.transport == "ibgda"
    assert res.reason.endswith("has no compiled NCCL kernel; supported: 1x2, 1x8")
    res = tr.resolve([("auto", "argument")] * n, *_hosts(1, 8), [V] * n, [V] * n, shapes=only)
    assert res.transport == "nccl"
