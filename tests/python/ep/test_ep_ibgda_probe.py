"""EP's IBGDA probe where no NIC exists (every machine here): a reason, said once, never an error."""

import logging

import pytest

from mooncake import _ep_runtime


@pytest.fixture
def fresh_probe(monkeypatch):
    monkeypatch.setattr(_ep_runtime, "_ibgda", None)


def test_reason_is_the_probes_answer_as_a_sentence(fresh_probe):
    reason = _ep_runtime.ibgda_reason()
    module = _ep_runtime.runtime()
    if module is None:
        assert reason.startswith("IBGDA is unavailable: the compiled EP runtime is not available")
        return
    device, why = module.ibgda_status([])
    if not hasattr(module, "IbgdaLink"):
        assert reason == ("IBGDA is unavailable: this runtime was built without RDMA "
                          "(WITH_RDMA=OFF)")
        assert _ep_runtime.ibgda_device() == ""
    elif device:
        assert reason == f"IBGDA-capable device {device}"
        assert _ep_runtime.ibgda_device() == device
    else:
        assert _ep_runtime.ibgda_device() == ""
        assert why.startswith(("no RDMA device", "no IBGDA-capable device",
                               "the verbs library is missing")), why
        assert reason == f"IBGDA is unavailable: {why}"


def test_said_once_per_process(fresh_probe, caplog):
    with caplog.at_level(logging.INFO, logger="mooncake.ep"):
        first = _ep_runtime.ibgda_reason()
        second = _ep_runtime.ibgda_reason()
        _ep_runtime.ibgda_device()
    assert first == second
    lines = [r.getMessage() for r in caplog.records if r.name == "mooncake.ep"]
    assert lines == [f"Mooncake EP: {first}"]


def test_device_filter_reaches_the_probe():
    module = _ep_runtime.runtime()
    if module is None:
        pytest.skip(f"no compiled EP runtime here: {_ep_runtime.unavailable_reason()}")
    device, why = module.ibgda_status(["mlx5_0:0"])  # port 0 does not exist
    assert device == ""
    assert "device_filter entry 'mlx5_0:0' has port '0'" in why, why
    device, why = module.ibgda_status(["mlx5_77"])  # no such device here
    assert device == "" and why, why


def test_pg_device_filter_reaches_the_probe(fresh_probe):
    module = _ep_runtime.runtime()
    if module is None or not hasattr(module, "IbgdaLink"):
        pytest.skip(f"this build's EP runtime has no IBGDA (needs WITH_RDMA): "
                    f"{_ep_runtime.unavailable_reason() or 'built without RDMA'}")
    from mooncake import pg
    before = pg.get_device_filter()
    pg.set_device_filter(["mlx5_0:0"])  # port 0 does not exist: the probe says so
    try:
        assert _ep_runtime.device_filter() == ["mlx5_0:0"]
        reason = _ep_runtime.ibgda_reason()
        assert "device_filter entry 'mlx5_0:0' has port '0'" in reason, reason
    finally:
        pg.set_device_filter(before)
    assert _ep_runtime.device_filter() == before
    assert "mlx5_0:0" not in _ep_runtime.ibgda_reason()  # asked again for the new filter
