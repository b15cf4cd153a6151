"""A fleet profile -> its members: one single-host profile per replica, and where the router runs.

Pure but for the address of a host (an ssh alias resolved through ssh_config), which is passed in. Each replica is
its own deployment on its host, named `<fleet>-r<index>`, so two replicas on one host never share a directory; the
router is the deployment `<fleet>-router`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from deployer.errors import ProfileError
from deployer.host import probe_address
from deployer.profile.model import Profile, Replica, Router, Target
from deployer.remote.connect import spec_of, ssh_address
from deployer.secrets import MASK

AddressOf = Callable[[Target], str]
ROUTER_HEALTH_PATH = "/readiness"


@dataclass(frozen=True)
class ReplicaMember:
    """One replica: its own deployment (single-host profile) and the URL the router reaches it at."""

    index: int
    profile: Profile
    address: str        # where the router reaches the engine: `listen`, or the host's address for a wildcard bind

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def host(self) -> str:
        return self.profile.target.host

    @property
    def tag(self) -> str:
        """How output names this replica: `r0@gpu-a`."""
        return f"r{self.index}@{self.host}"

    @property
    def url(self) -> str:
        return http_url(self.address, self.profile.engine.port)


@dataclass(frozen=True)
class RouterMember:
    """The router's deployment: where it runs, the address it binds, and its settings."""

    name: str
    target: Target
    bind: str
    router: Router
    # smg's --api-key: what it sends to the replicas and what its own API asks for (the replicas' key by default)
    api_key: str | None = field(default=None, repr=False)
    # the key of smg's control plane (its worker API), only deployer's: deployments/fleet/router_key.py
    control_key: str | None = field(default=None, repr=False)

    @property
    def bearer(self) -> str | None:
        """What opens this router's worker API: its control key; the shared key for a router an earlier release
        started (then that one guarded it)."""
        return self.control_key or self.api_key

    @property
    def host(self) -> str:
        return self.target.host

    @property
    def tag(self) -> str:
        return f"router@{self.host}"


@dataclass(frozen=True)
class Fleet:
    name: str
    profile: Profile
    replicas: list[ReplicaMember]
    router: RouterMember | None

    def hosts(self) -> list[str]:
        """Every host of the fleet, in first-seen order (replicas, then the router's)."""
        seen: dict[str, None] = {}
        for replica in self.replicas:
            seen.setdefault(replica.host, None)
        if self.router is not None:
            seen.setdefault(self.router.host, None)
        return list(seen)

    def replica(self, index: int) -> ReplicaMember:
        if not 0 <= index < len(self.replicas):
            raise ProfileError(f"{self.name} has replicas 0..{len(self.replicas) - 1}, not {index}")
        return self.replicas[index]


def http_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def fleet_of(profile: Profile, address_of: AddressOf = ssh_address) -> Fleet:
    """The members of a `replicas:` fleet profile; ProfileError (one line) for what cannot be deployed."""
    if not isinstance(profile.replicas, list):
        if profile.nodes is not None:
            raise ProfileError(f"{profile.name}: `nodes:` (one engine over several hosts) is deployed by the "
                               "multi-node path, not as replicas")
        raise ProfileError(f"{profile.name}: replicas: a count is only for `deploy export k8s`; list the hosts "
                           "(replicas: [{host: gpu-a}, {host: gpu-b}]) to deploy over SSH")
    replicas = []
    for i, entry in enumerate(profile.replicas):
        single = replica_profile(profile, i, entry, address_of)
        wildcard = probe_address(single.engine.host) != single.engine.host.strip("[]")
        replicas.append(ReplicaMember(i, single, address_of(single.target) if wildcard else single.engine.host))
    _distinct_endpoints(profile.name, replicas, address_of)
    router = router_member(profile, address_of) if profile.router is not None else None
    return Fleet(profile.name, profile, replicas, router)


def replica_profile(profile: Profile, index: int, entry: Replica, address_of: AddressOf) -> Profile:
    """The single-host profile of replica `index`: its own name and target, its GPUs, port and bind address."""
    target = Target(**{k: getattr(entry, k) for k in Target.model_fields})
    listen = entry.listen or address_of(target)
    engine = profile.engine.model_copy(update={
        "port": entry.engine_port or profile.engine.port,
        "gpus": entry.gpus if entry.gpus is not None else profile.engine.gpus,
        "host": listen,
    })
    single = profile.with_engine(engine)
    out = single.model_copy(update={"name": f"{profile.name}-r{index}", "target": target, "replicas": None,
                                    "router": None, "nodes": None, "rollout": None})
    out._source, out._secret_env, out._secret_args = single._source, single._secret_env, single._secret_args
    out._templates, out._unset = dict(single._templates), list(single._unset)
    return out


def router_member(profile: Profile, address_of: AddressOf) -> RouterMember:
    assert profile.router is not None
    given = profile.router.target.model_dump(exclude_none=True)
    first = profile.target.model_dump()
    target = Target(**({**first, **given} if "host" not in given else {**{"workdir": first["workdir"]}, **given}))
    bind = str(profile.router.args.get("host") or address_of(target))
    key = profile.router.args.get("api_key", profile.engine.args.get("api_key"))
    usable = key if isinstance(key, str) and key != MASK else None  # a fleet read from its record has it masked
    return RouterMember(f"{profile.name}-router", target, bind, profile.router, usable)


def _distinct_endpoints(name: str, replicas: list[ReplicaMember], address_of: AddressOf) -> None:
    """Two replicas on one host need distinct engine ports (the port claim on a host covers every address)."""
    seen: dict[tuple[str, int], ReplicaMember] = {}
    for replica in replicas:
        key = (address_of(replica.profile.target), replica.profile.engine.port)
        other = seen.get(key)
        if other is not None:
            raise ProfileError(f"{name}: replicas {other.index} and {replica.index} both use port {key[1]} on "
                               f"{replica.host}; give one of them engine_port:")
        seen[key] = replica
