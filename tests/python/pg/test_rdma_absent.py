"""Without an RDMA NIC (every machine here), in a real process:

* the engine says once why peers on other hosts use tcp ("no RDMA device",
  or why the verbs library is missing), however many engines and groups the
  process creates, and everything else works;
* TransferEngine.rdma_status / preferred_hca and pg.get_preferred_hca answer
  (empty lists), and an unknown location raises ValueError naming it;
* a device filter naming absent HCAs is not an error; a malformed one is.
"""

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import torch, torch.distributed as dist
from mooncake import pg
from mooncake.engine import TransferEngine

store = dist.HashStore()
a = TransferEngine(store, key_prefix="a")
b = TransferEngine(store, key_prefix="b", device_filter=["mlx5_0", "mlx5_1:1"])
print("STATUS", a.rdma_status)
print("HCA", a.preferred_hca("cuda:0"), a.preferred_hca("cpu"), a.preferred_hca("cpu:0"))
try:
    a.preferred_hca("gpu0")
except ValueError as e:
    print("ERR", e)
try:
    TransferEngine(store, key_prefix="c", device_filter=["mlx5_0:0"])
except ValueError as e:
    print("FILTER", e)
a.close()
b.close()
pg.set_device_filter(["mlx5_0"])
dist.init_process_group("mooncake-cpu", rank=0, world_size=1, store=dist.HashStore())
g = dist.group.WORLD
print("PG", pg.get_preferred_hca(g), pg.get_preferred_hca(g, "cuda:0"), pg.get_preferred_hca(g, "cpu"))
try:
    pg.get_preferred_hca(g, "tpu:0")
except ValueError as e:
    print("PGERR", e)
x = torch.arange(4, dtype=torch.float32)
dist.all_reduce(x)
print("SUM", x.tolist())
dist.destroy_process_group()
"""


def test_no_rdma_device_is_reported_once_and_tcp_is_used():
    env = dict(os.environ, MC_LOG_LEVEL="info", MC_LOG_SUBSYS="rdma")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"),
         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    if out["STATUS"] == "rdma":
        pytest.skip("this host has a usable RDMA device; the no-device path cannot be shown")
    reasons = ("no RDMA device", "the verbs library is missing", "WITH_RDMA=OFF")
    assert any(r in out["STATUS"] for r in reasons), out["STATUS"]
    said = [l for l in proc.stderr.splitlines() if "peers on other hosts use tcp" in l]
    # Three engines (two here, one for the group): one line.
    assert len(said) == 1, proc.stderr
    assert out["STATUS"] in said[0]
    assert out["HCA"] == "[] [] []"
    assert out["ERR"] == ("TransferEngine.preferred_hca: location 'gpu0': expected 'cpu', "
                          "'cpu:<NUMA node>' or 'cuda:<device>'")
    assert "device_filter entry 'mlx5_0:0' has port '0'" in out["FILTER"], out["FILTER"]
    assert out["PG"] == "[] [] []"
    assert "location 'tpu:0'" in out["PGERR"]
    assert out["SUM"] == "[0.0, 1.0, 2.0, 3.0]"
