"""Prometheus scrape targets for a profile (`deploy export prometheus`): every engine and router it deploys, as
file_sd JSON (https://prometheus.io/docs/guides/file-sd/): `[{"targets": ["host:port"], "labels": {...}}]`.

Owns where each server of a profile serves its Prometheus metrics and the labels deployer knows about it. Pure:
reads the profile only, never a target. Each kind of deployment lists its own servers with the pieces here
(`Deployment.scrape_targets`): a single-host profile is one engine (`engine_targets`); a `replicas:` fleet's
replicas and router are listed by deployer.deployments.fleet.scrape, a `nodes:` group's nodes by
deployer.deployments.nodes.scrape.

Whether an engine serves its series at all depends on a flag for some engines (the `switch` of the engine's
metrics.yaml, deployer.observe.names): a profile without it still gets its targets, with a warning.

Addresses: a host is the host as written in the profile (an ~/.ssh/config alias stays the alias, `local` is
127.0.0.1): the machine Prometheus runs on must resolve and reach it, and ssh_config's `HostName` is not read
unless the caller passes `address_of` (e.g. `deployer.remote.connect.ssh_address`). An engine bound to one
address is scraped there; one bound to every interface at its host's address; one bound to loopback on another
host cannot be reached from elsewhere: its target is still written (at the host's address) with a warning.

Label names avoid the ones the servers put on their own series (`engine`, `model_name`, `engine_type`,
`tp_rank`...): a target label of the same name would make Prometheus rename the server's to `exported_<name>`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from deployer.observe.names import MetricsSwitch, load_metric_names
from deployer.host import host_port, probe_address
from deployer.profile.model import Profile, Target
from deployer.host import LOCAL

METRICS_PATH = "/metrics"   # where the engines and smg's metrics server serve Prometheus text
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})

AddressOf = Callable[[Target], str]


class Role(str, Enum):
    """What a scraped server is."""

    ENGINE = "engine"
    ROUTER = "router"


@dataclass(frozen=True)
class TargetLabels:
    """The labels deployer puts on one target (None: not known or not applicable, left out)."""

    deployment: str            # the deployment's name as deployer names it (`<fleet>-r0`, `<fleet>-router`)
    profile: str               # the profile's name (the fleet's or node group's for its members)
    role: Role
    host: str                  # the target host as written in the profile
    engine_kind: str | None = None
    engine_version: str | None = None   # engine.version, when the profile pins it
    replica: str | None = None          # the replica's tag as deployer's output names it: `r0@gpu-a`
    node_rank: int | None = None
    metrics_path: str = METRICS_PATH

    def as_dict(self) -> dict[str, str]:
        out = {"__metrics_path__": self.metrics_path, "deployment": self.deployment, "profile": self.profile,
               "role": self.role.value, "host": self.host}
        optional = {"engine_kind": self.engine_kind, "engine_version": self.engine_version,
                    "replica": self.replica, "node_rank": None if self.node_rank is None else str(self.node_rank)}
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


@dataclass(frozen=True)
class ScrapeTarget:
    """One server to scrape: `host:port` and its labels."""

    address: str
    labels: TargetLabels

    def to_json(self) -> dict[str, Any]:
        return {"targets": [self.address], "labels": self.labels.as_dict()}


@dataclass(frozen=True)
class PromExport:
    """The scrape targets of a profile and what would keep Prometheus from reading them."""

    targets: list[ScrapeTarget]
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> list[dict[str, Any]]:
        """The file_sd data: one group per target (each has its own labels)."""
        return [t.to_json() for t in self.targets]

    def text(self) -> str:
        """The file_sd file's content."""
        return json.dumps(self.to_json(), indent=2) + "\n"


def written_address(target: Target) -> str:
    """The host as the profile writes it (`local`: this machine's loopback)."""
    return "127.0.0.1" if target.host == LOCAL else target.host


def metrics_switch(profile: Profile) -> MetricsSwitch | None:
    """The flag that switches the engine's /metrics series on or off, from the engine's own metrics.yaml."""
    path = profile.engine.definition.knowledge.metrics
    return load_metric_names(path).switch if path is not None else None


def engine_targets(profile: Profile, address_of: AddressOf = written_address) -> PromExport:
    """A single-host profile's engine as a scrape target, with warnings (metrics off, a loopback bind)."""
    reach = reach_of(profile, address_of)
    return PromExport([engine_target(profile, engine_labels(profile, profile.name), reach)], reach.warnings)


def reach_of(profile: Profile, address_of: AddressOf) -> Reach:
    """The addresses' writer, its warnings started with the engine's metrics switch when it is off."""
    found = Reach(address_of)
    switch = metrics_switch(profile)
    if switch is not None and not switch.serves(profile.engine.args):
        found.warnings.append(f"{profile.name}: {switch.fix}; its targets are listed anyway")
    return found


@dataclass
class Reach:
    """How addresses are written (`address_of`) and the warnings gathered on the way."""

    address_of: AddressOf
    warnings: list[str] = field(default_factory=list)

    def address(self, bind: str, target: Target, what: str, setting: str) -> str:
        """Where Prometheus reaches a server bound to `bind` on `target`: that address, or the host's for a
        wildcard or (with a warning, unless the host is this machine) a loopback bind."""
        address = probe_address(bind)
        if address != bind.strip("[]"):  # a wildcard bind answers on every address of its host
            return self.address_of(target)
        if (address in LOOPBACK or address.startswith("127.")) and target.host != LOCAL:
            self.warnings.append(f"{what}: binds {address} on {target.host}, where only a Prometheus on that "
                                 f"host can scrape it; set {setting} to an address Prometheus reaches (its "
                                 f"target is written at {target.host})")
            return self.address_of(target)
        return address


def engine_labels(single: Profile, group: str, *, replica: str | None = None,
                  node_rank: int | None = None) -> TargetLabels:
    """The labels of one single-host profile's engine (a replica's, a node's) in the profile named `group`."""
    engine = single.engine
    return TargetLabels(deployment=single.name, profile=group, role=Role.ENGINE, host=single.target.host,
                        engine_kind=engine.kind, engine_version=engine.version, replica=replica,
                        node_rank=node_rank)


def engine_target(single: Profile, labels: TargetLabels, reach: Reach) -> ScrapeTarget:
    """The engine of one single-host profile (a replica's, a node's): where it answers on its port."""
    what = labels.deployment if labels.node_rank is None else f"{labels.deployment} node {labels.node_rank}"
    address = reach.address(single.engine.host, single.target, what, "engine.host")
    return ScrapeTarget(host_port(address, single.engine.port), labels)
