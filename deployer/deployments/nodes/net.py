"""The network facts of a multi-node engine: node 0's address as the others reach it, and on every node the
interface that carries the group's traffic (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME).

Node 0's address is the one we reached it at over SSH (the server side of $SSH_CONNECTION); its interface is the
one holding that address. A follower's interface is the one its kernel routes node 0's address through
(`ip -o route get`), and its own address is the one we reached it at when that interface holds it, else the
route's source. Loopback is never chosen unless every node is on loopback (the test world); `engine.nic`, when
given, is checked to exist on every node instead. One round trip per node.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field

from deployer.errors import PreflightFailed
from deployer.deployments.nodes.plan import NodeNet
from deployer.remote.base import Remote

NET_TIMEOUT_S = 30.0


@dataclass
class NetFacts:
    """What one node's `ip` says: its SSH server address, its IPv4 interfaces, and the route to node 0."""

    ssh_addr: str | None = None
    interfaces: dict[str, list[ipaddress.IPv4Interface]] = field(default_factory=dict)
    route_dev: str | None = None
    route_src: str | None = None
    has_ip: bool = False
    utc_offset_s: int = 0          # the node's local time minus UTC (its engine logs local time)


def net_command(node0_addr: str | None) -> str:
    route = f"ip -o route get {shlex.quote(node0_addr)} 2>/dev/null | sed 's/^/@@route /'; " if node0_addr else ""
    return ("printf '@@ssh %s\\n' \"${SSH_CONNECTION:-}\"; printf '@@tz %s\\n' \"$(date +%z)\"; "
            "if command -v ip >/dev/null 2>&1; then echo @@has-ip; "
            f"ip -o -4 addr show 2>/dev/null | sed 's/^/@@addr /'; {route}fi")


def parse_net(text: str) -> NetFacts:
    facts = NetFacts()
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        words = rest.split()
        if tag == "@@ssh" and len(words) >= 3:
            facts.ssh_addr = words[2]
        elif tag == "@@tz" and len(words) == 1 and len(words[0]) == 5 and words[0][1:].isdigit():
            sign = -1 if words[0][0] == "-" else 1
            facts.utc_offset_s = sign * (int(words[0][1:3]) * 3600 + int(words[0][3:5]) * 60)
        elif tag == "@@has-ip":
            facts.has_ip = True
        elif tag == "@@addr" and len(words) >= 4 and words[2] == "inet":
            try:
                facts.interfaces.setdefault(words[1].rstrip(":"), []).append(ipaddress.IPv4Interface(words[3]))
            except ValueError:
                continue
        elif tag == "@@route":
            facts.route_dev = _after(words, "dev")
            facts.route_src = _after(words, "src")
    return facts


def _after(words: list[str], key: str) -> str | None:
    return words[words.index(key) + 1] if key in words and words.index(key) + 1 < len(words) else None


def holder(facts: NetFacts, addr: str) -> str | None:
    """The interface that holds `addr` (exactly, else in its subnet)."""
    try:
        ip = ipaddress.IPv4Address(addr)
    except ValueError:
        return None
    exact = [name for name, ifs in facts.interfaces.items() if any(i.ip == ip for i in ifs)]
    inside = [name for name, ifs in facts.interfaces.items() if any(ip in i.network for i in ifs)]
    found = exact or inside
    return found[0] if found else None


def gather_net(remote: Remote, node0_addr: str | None) -> NetFacts:
    return parse_net(remote.run(net_command(node0_addr), timeout=NET_TIMEOUT_S, check=False).stdout)


def node0_address(facts: NetFacts, host: str) -> str:
    """Where the others reach node 0: the address we reached it at over SSH, else its host as written."""
    return facts.ssh_addr or host


def decide(facts: list[NetFacts], node0_addr: str, hosts: list[str], nic: str | None) -> list[NodeNet]:
    """Every node's address and interface; PreflightFailed with one line when the network cannot carry it."""
    addrs = [node0_addr] + [_follower_addr(f, host) for f, host in zip(facts[1:], hosts[1:])]
    all_loopback = all(_loopback(a) for a in addrs)
    out: list[NodeNet] = []
    for rank, (fact, addr) in enumerate(zip(facts, addrs)):
        if nic is not None:
            if fact.has_ip and nic not in fact.interfaces:
                found = ", ".join(sorted(fact.interfaces)) or "none"
                raise PreflightFailed([f"engine.nic {nic}: no such interface on node {rank} ({hosts[rank]}); "
                                       f"it has: {found}"])
            out.append(NodeNet(addr=addr, nic=nic))
            continue
        dev = holder(fact, node0_addr) if rank == 0 else fact.route_dev
        if dev is not None and _is_loopback_dev(fact, dev) and not all_loopback:
            raise PreflightFailed([
                f"node {rank} ({hosts[rank]}) would reach node 0 at {node0_addr} over the loopback interface {dev}: "
                "the other nodes cannot; set engine.nic to the interface of the network between the nodes, or "
                "reach node 0 by its network address"])
        out.append(NodeNet(addr=addr, nic=dev))
    return out


def _follower_addr(facts: NetFacts, host: str) -> str:
    if facts.ssh_addr and facts.route_dev and facts.route_dev in facts.interfaces and \
            holder(facts, facts.ssh_addr) == facts.route_dev:
        return facts.ssh_addr
    return facts.route_src or facts.ssh_addr or host


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def _is_loopback_dev(facts: NetFacts, dev: str) -> bool:
    ifs = facts.interfaces.get(dev) or []
    return dev == "lo" or any(i.ip.is_loopback for i in ifs)
