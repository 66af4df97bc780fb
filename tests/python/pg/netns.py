"""Two network namespaces joined by a veth pair: two "hosts" on one machine.

    with two_hosts() as hosts:            # NamespacesUnavailable: skip with its reason
        hosts.names                        # ("mcA1b2c3", "mcB1b2c3")
        hosts.addrs                        # ("10.201.0.1", "10.201.0.2")

Each namespace has its own loopback and its own abstract unix socket space, so
ranks in different namespaces can reach each other only through the veth
addresses, exactly as on two hosts. The addresses are a private /30 that exists
only inside the two namespaces (nothing leaves them). Names are unique per call;
the namespaces (and with them the veth pair) are deleted on exit, also after a
failure. Needs root and `ip netns`.
"""

import os
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass

SUBNET = "10.201.0.{}/30"


class NamespacesUnavailable(Exception):
    """Why two namespaces could not be made here (the test skips with this text)."""


@dataclass
class TwoHosts:
    names: tuple
    addrs: tuple
    ifaces: tuple


def _ip(*args, ns=None):
    cmd = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _check_available():
    if shutil.which("ip") is None:
        raise NamespacesUnavailable("the `ip` tool (iproute2) is not installed")
    if os.geteuid() != 0:
        raise NamespacesUnavailable(f"network namespaces need root (running as uid {os.geteuid()})")


@contextmanager
def two_hosts():
    _check_available()
    tag = secrets.token_hex(3)
    names = (f"mcA{tag}", f"mcB{tag}")
    ifaces = (f"mcva{tag}", f"mcvb{tag}")  # under the 15-character limit
    addrs = (SUBNET.format(1).split("/")[0], SUBNET.format(2).split("/")[0])
    created = []
    try:
        for ns in names:
            try:
                _ip("netns", "add", ns)
            except RuntimeError as e:
                raise NamespacesUnavailable(f"cannot create a network namespace: {e}") from e
            created.append(ns)
        _ip("link", "add", ifaces[0], "netns", names[0], "type", "veth",
            "peer", "name", ifaces[1], "netns", names[1])
        for ns, iface, i in zip(names, ifaces, (1, 2)):
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("addr", "add", SUBNET.format(i), "dev", iface, ns=ns)
            _ip("link", "set", iface, "up", ns=ns)
        yield TwoHosts(names=names, addrs=addrs, ifaces=ifaces)
    finally:
        errors = []
        for ns in created:
            try:
                _ip("netns", "del", ns)  # also removes the veth end inside it
            except RuntimeError as e:
                errors.append(str(e))
        if errors:
            raise RuntimeError("network namespace cleanup failed: " + "; ".join(errors))
