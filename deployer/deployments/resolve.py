"""resolve: which Deployment a NAME|PROFILE argument (+ --host, --workdir, selectors) means. The one place that
tells the kinds apart.

Rules, in order:
1. A profile file an earlier command loaded that is unchanged since (deployer.local.remembered), with no
   selector, in a reading command (`Mode.read`): that single host, without loading the profile.
2. A profile file with `nodes:` (or --node given, which needs one): a NodeGroup (`--node N`: that node).
3. A profile file with `replicas:` or `router:`: a ReplicaFleet (--host then picks a member for `logs` and is
   refused by up/status/down).
4. --replica N or --router with no fleet file: the fleet of that name whose router runs on --host (its record,
   fleet.json), else NotFound.
5. Anything else: a SingleHost (a profile file, or a name with --host). When that name is no deployment on that
   host, `status` and `down` ask for a fleet of that name whose router runs there (rule 4's record).

`for_profile` is the same choice for a profile already loaded (up, plan, smoke).

The fleet and node-group kinds (and the profile loader) are imported only where a profile file or a fleet
record names them: a bare name's `status` stays as light to start as a single host's on-call reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.deployments.base import Deployment, Select
from deployer.deployments.single.deployment import Origin, SingleHost
from deployer.errors import NotFound, ProfileError
from deployer.operate.deployment import Ref, make_ref, remembered_ref
from deployer.local.remembered import remember

if TYPE_CHECKING:
    from deployer.deployments.fleet.deployment import ReplicaFleet
    from deployer.profile.model import Profile


@dataclass(frozen=True)
class Mode:
    """How a command reaches its deployment: `read_only` (changes no engine: the engine's `${VAR}`s may be
    unset) and `remembered` (a remembered profile file need not be loaded again)."""

    read_only: bool = True
    remembered: bool = False


READ = Mode(read_only=True, remembered=True)     # status, logs, history, diagnose
STOP = Mode(read_only=True, remembered=False)    # down
CHANGE = Mode(read_only=False, remembered=False)  # restart, rollback, prune


def names_file(arg: str | None) -> bool:
    """Whether a NAME|PROFILE argument names a profile file (else it is a deployment's name)."""
    return arg is not None and (Path(arg).is_file() or arg.endswith((".yaml", ".yml")))


def is_group(profile: Profile) -> bool:
    return profile.nodes is not None


def is_fleet(profile: Profile) -> bool:
    return profile.nodes is None and (profile.replicas is not None or profile.router is not None)


def resolve(target: str | None, host: str | None = None, workdir: str | None = None, *,
            trust_new_host: bool = False, select: Select = Select(), mode: Mode = READ) -> Deployment:
    """The Deployment TARGET (a profile file or a deployment's name) means; see the module's rules. A profile file
    is read once: its kind, and then the deployment, come from that one load."""
    origin = Origin(target, host, workdir, trust_new_host)
    if mode.remembered and select.whole and names_file(target):
        assert target is not None
        ref = remembered_ref(target, host, workdir, trust_new_host)
        if ref is not None:
            return SingleHost(lambda: ref, origin=origin)
    prof = _load_file(target, mode)
    if select.node is not None and (prof is None or not prof.nodes):
        raise ProfileError("--node needs a profile file with nodes: (a name and --host cannot say which hosts "
                           "are its nodes)")
    if prof is not None and is_group(prof):
        from deployer.deployments.nodes.deployment import NodeGroup

        return NodeGroup(prof, select=select, workdir=workdir, trust_new_host=trust_new_host,
                         as_single=_single_file(prof, origin, mode))
    if prof is not None and is_fleet(prof):
        from deployer.deployments.fleet.deployment import ReplicaFleet

        return ReplicaFleet(prof, host=host, trust_new_host=trust_new_host, select=select,
                            as_single=_single_file(prof, origin, mode))
    if select.replica is not None or select.router:
        found = fleet_by_name(origin, select)
        if found is None:
            raise NotFound(f"no fleet {target!r} here: --replica and --router need a fleet profile file, or a "
                           "fleet's name with --host of its router's host")
        return found
    return _single(origin, mode) if prof is None else _single_file(prof, origin, mode)


def for_profile(profile: Profile, origin: Origin = Origin(), *, load_error: ProfileError | None = None) -> Deployment:
    """The Deployment of a profile already loaded (`up`, `plan`, `smoke`); a kind's modules imported only for a
    profile of that kind (a fleet's are ~0.2 s of a single host's `up`, `plan` or `render`)."""
    single = SingleHost(lambda: _ref_of_profile(profile, origin), profile=profile, origin=origin,
                        load_error=load_error)
    if is_group(profile):
        from deployer.deployments.nodes.deployment import NodeGroup

        return NodeGroup(profile, workdir=origin.workdir, trust_new_host=origin.trust_new_host, as_single=single)
    if is_fleet(profile):
        from deployer.deployments.fleet.deployment import ReplicaFleet

        return ReplicaFleet(profile, host=origin.host, trust_new_host=origin.trust_new_host, as_single=single)
    return single


def unloaded(error: ProfileError, origin: Origin = Origin()) -> SingleHost:
    """A profile file that did not load: `smoke` still reports it (its preflight case fails, the others skip)."""
    def no_ref() -> Ref:
        raise error

    return SingleHost(no_ref, origin=origin, load_error=error)


def _ref_of_profile(profile: Profile, origin: Origin) -> Ref:
    from deployer.remote.connect import target_spec

    return Ref(profile.name, target_spec(profile, origin.trust_new_host),
               origin.workdir or profile.target.workdir, profile)


def _single(origin: Origin, mode: Mode) -> SingleHost:
    def ref() -> Ref:
        return make_ref(origin.arg, origin.host, origin.workdir, origin.trust_new_host, origin.overrides,
                        read_only=mode.read_only)

    return SingleHost(ref, origin=origin, fleet_here=lambda: fleet_by_name(origin))


def _single_file(prof: Profile, origin: Origin, mode: Mode) -> SingleHost:
    """The single host of a profile file already loaded, as `_single` makes it (make_ref's Ref, when first asked:
    --host applied as the loader applies it, remembered by a reading command) without loading the file again.
    A fleet's or a node group's with --host stays `_single`: the loader refuses the two together, as before."""
    if origin.host and (is_group(prof) or is_fleet(prof)):
        return _single(origin, mode)

    def ref() -> Ref:
        from deployer.profile.loader import with_host

        loaded = with_host(prof, origin.host) if origin.host else prof
        if mode.read_only:
            assert origin.arg is not None
            remember(origin.arg, origin.overrides, origin.host, loaded)
        return _ref_of_profile(loaded, origin)

    return SingleHost(ref, origin=origin, fleet_here=lambda: fleet_by_name(origin))


def _load_file(arg: str | None, mode: Mode) -> Profile | None:
    """The profile ARG names, loaded (without --host: a fleet's and a node group's hosts are in the file), or
    None for a name."""
    if not arg or not names_file(arg):
        return None
    from deployer.profile.loader import READ_ONLY, load_profile

    return load_profile(arg, allow_unset=READ_ONLY if mode.read_only else False)


def fleet_by_name(origin: Origin, select: Select = Select()) -> ReplicaFleet | None:
    """A bare NAME with --host that is no deployment there: the fleet of that name whose router runs on that host
    (its record, fleet.json), or None. Its members are then named by the record, not by --host."""
    if not origin.arg or not origin.host:
        return None
    from deployer.deployments.fleet.record import find_fleet

    ref = make_ref(origin.arg, origin.host, origin.workdir, origin.trust_new_host)
    prof = find_fleet(ref.spec, ref.workdir, origin.arg)
    if prof is None:
        return None
    from deployer.deployments.fleet.deployment import ReplicaFleet   # only for a fleet: its modules are ~0.3 s

    return ReplicaFleet(prof, trust_new_host=origin.trust_new_host, select=select)
