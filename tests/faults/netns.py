"""Worker hosts on one machine: Linux network namespaces on a private bridge (needs root).

``Network(hosts=3)`` makes a bridge ``sagabr<pid>`` with a private /24 of its own
(``10.213.<n>.0/24``, the first ``n`` no address or route of this machine is in, taken under a
file lock so parallel test processes pick different ones), and one namespace per host,
``sagans<pid>h<i>``, joined to the bridge by a veth pair (``sagav<pid>h<i>`` on the bridge,
``eth0`` inside) with address ``.<10 + i>``. The machine itself is ``.1`` on the bridge: servers
that must be reachable from the hosts listen there (``bench.servers``' ``listen``,
``tests.procs.start_providers``' ``host``). A host has no other route: its processes reach the
bridge's subnet and their own loopback, nothing else.

``cut(i)`` takes the host's link down on the bridge's side: its packets, and the packets sent to
it, are dropped from then on, as when a host's cable is pulled or its switch port fails; its
processes keep running and their sockets stay open. ``heal(i)`` brings the link back.

``command(i, argv)`` is ``argv`` to run in host ``i``'s namespace (``ip netns exec``, which execs
it: the PID is the command's); start it in a session of its own so that a kill takes its group.

``close()`` deletes the namespaces, the veths and the bridge; it is safe to call twice and
after a failure half-way. ``clean_leftovers()`` deletes what a crashed run left behind: every
namespace and link of these prefixes whose owner (the PID in its name) is gone.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import subprocess
from pathlib import Path

from bench.servers import pid_alive

BRIDGE_PREFIX = "sagabr"
VETH_PREFIX = "sagav"
NS_PREFIX = "sagans"
SUBNET_BASE = "10.213"
LOCK_PATH = Path("/tmp/saga-netns.lock")
_OWNER = re.compile(rf"^(?:{BRIDGE_PREFIX}|{VETH_PREFIX}|{NS_PREFIX})(\d+)(?:h\d+)?$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def _names() -> tuple[list[str], list[str]]:
    """(network namespaces, links) of this machine."""
    namespaces = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    links = [line.split()[0].split("@")[0] for line in _ip("-br", "link").stdout.splitlines() if line.strip()]
    return namespaces, links


def clean_leftovers() -> list[str]:
    """Delete the namespaces, veths and bridges of runs whose process is gone; their names."""
    removed = []
    namespaces, links = _names()
    for name in namespaces:
        found = _OWNER.match(name)
        if found and name.startswith(NS_PREFIX) and not pid_alive(int(found.group(1))):
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    for name in links:
        found = _OWNER.match(name)
        if found and not name.startswith(NS_PREFIX) and not pid_alive(int(found.group(1))):
            _ip("link", "delete", name, check=False)  # a veth's peer goes with it
            removed.append(name)
    return removed


def _subnet_in_use(subnet: ipaddress.IPv4Network) -> bool:
    for line in _ip("-4", "-o", "addr").stdout.splitlines() + _ip("-4", "route").stdout.splitlines():
        for word in line.split():
            try:
                net = ipaddress.ip_network(word, strict=False)
            except ValueError:
                continue
            if net.version == 4 and not net.is_loopback and net.prefixlen > 0 and net.overlaps(subnet):
                return True
    return False


class Network:
    """A bridge and ``hosts`` namespaces on it (see the module's docstring)."""

    def __init__(self, hosts: int) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("network namespaces need root")
        self.owner = os.getpid()
        self.bridge = f"{BRIDGE_PREFIX}{self.owner}"
        self.namespaces = [f"{NS_PREFIX}{self.owner}h{i}" for i in range(1, hosts + 1)]
        self.veths = [f"{VETH_PREFIX}{self.owner}h{i}" for i in range(1, hosts + 1)]
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""  # this machine's address on the bridge
        self.addresses: list[str] = []  # each host's
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        clean_leftovers()
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes must not pick the same subnet
            for step in range(256):
                candidate = ipaddress.ip_network(f"{SUBNET_BASE}.{(self.owner + step) % 256}.0/24")
                if not _subnet_in_use(candidate):
                    self.subnet = candidate
                    break
            else:
                raise RuntimeError(f"no free /24 in {SUBNET_BASE}.0.0/16")
            hosts = list(self.subnet.hosts())
            self.gateway = str(hosts[0])
            self.addresses = [str(hosts[9 + i]) for i in range(1, len(self.namespaces) + 1)]
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, veth, address in zip(self.namespaces, self.veths, self.addresses):
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, host: int) -> None:
        """Host ``host`` (1-based) loses the network: its link goes down on the bridge's side."""
        _ip("link", "set", self.veths[host - 1], "down")

    def heal(self, host: int) -> None:
        _ip("link", "set", self.veths[host - 1], "up")

    def command(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` run in host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[host - 1], *argv]

    def close(self) -> None:
        """Delete the namespaces, veths and bridge (what exists of them)."""
        namespaces, links = _names()
        for ns in self.namespaces:
            if ns in namespaces:
                _ip("netns", "delete", ns, check=False)
        for link in (*self.veths, self.bridge):
            if link in links:
                _ip("link", "delete", link, check=False)
