"""A replica fleet (`replicas:`, with or without a router): up / restart / rollback through this package's `up`,
status / down / logs of its members through `oncall`, smoke through `smoke`, upgrade (planned on the first replica,
--apply by the canary) through `upgrade`.

Its hosts are in the profile: --host does not apply to up, status or down (for `logs` it picks the member on
that host). `plan` plans each replica on its host and resolves the router's environment (router.install);
`prepare` builds every replica's environment and the router's. history, diagnose and prune act as they always
have on a fleet file: as on a single host (`as_single`).
"""

from __future__ import annotations

from pathlib import Path

from deployer.deployments.base import Deployment, DownOptions, ExportSource, LogOptions, Out, PruneOptions, Select
from deployer.deployments.reports import (DiagnosisReport, FleetDown, FleetPlan, FleetStatus, HistoryReport,
                                          PlanReport, PruneReport)
from deployer.deployments.single.deployment import Origin, SingleHost
from deployer.errors import DeployError, ProfileError
from deployer.export.prometheus import AddressOf, PromExport, written_address
from deployer.deployments.fleet.scrape import fleet_targets
from deployer.deployments.fleet.canary import canary_up
from deployer.deployments.fleet.members import ReplicaMember, fleet_of
from deployer.remote.connect import spec_of
from deployer.deployments.fleet.oncall import fleet_down, fleet_logs, fleet_status, member_ref, pick_member
from deployer.deployments.fleet.report import FleetReport
from deployer.deployments.fleet.router_env import plan_router, prepare_router
from deployer.deployments.fleet.smoke import FleetSmokeReport, smoke_fleet
from deployer.deployments.fleet.up import fleet_restart, fleet_rollback, fleet_up
from deployer.deployments.fleet.upgrade import upgrade_fleet
from deployer.operate.deployment import Ref
from deployer.operate.upgrade.outcome import Upgraded
from deployer.operate.upgrade.plan import UpgradeOptions
from deployer.runner.up import UpOptions
from deployer.prepare.report import PrepareReport
from deployer.runner.install import prepare_all
from deployer.profile.model import Profile
from deployer.prepare.pushed import WeightsNeeded
from deployer.remote.base import Remote
from deployer.smoke import SmokeOptions
from deployer.events import Event, EventSink


def _quiet(_event: Event) -> None:
    pass


def _no_weights(_remote: Remote, _profile: Profile) -> tuple[list[WeightsNeeded], list[str]]:
    """A replica whose host another replica's plan has asked about the weights already."""
    return [], []


class ReplicaFleet(Deployment):
    """Replicas of one engine on several hosts behind an optional router."""

    tagged_events = True

    def __init__(self, profile: Profile, *, host: str | None = None, trust_new_host: bool = False,
                 select: Select = Select(), as_single: SingleHost | None = None) -> None:
        """host: a --host given with the fleet (refused where it does not apply; `logs` picks the member on that
        host); select: `logs`' member (--replica N, --router)."""
        self.profile, self.name = profile, profile.name
        self.host, self.trust_new_host, self.select, self._single = host, trust_new_host, select, as_single

    @property
    def as_single(self) -> SingleHost:
        if self._single is None:
            raise ProfileError(f"{self.name} is a fleet: this command needs one deployment")
        return self._single

    def _no_host(self, what: str) -> None:
        if self.host:
            raise ProfileError(f"--host does not apply to `{what}` of a fleet profile: its hosts are in the profile")

    def up(self, opts: UpOptions, emit: EventSink) -> FleetReport:
        self._no_host("up")
        return canary_up(self.profile, opts, emit) if opts.canary else fleet_up(self.profile, opts, emit)

    def upgrade(self, opts: UpgradeOptions, apply_it: bool, emit: EventSink) -> Upgraded:
        """Planned on the first replica's host, carried to the fleet profile; `apply_it`: the canary rollout."""
        self._no_host("upgrade")
        return upgrade_fleet(self.profile, opts, self.trust_new_host, apply_it, emit)

    def _one(self) -> SingleHost:
        """The fleet's profile on the single-host path: `render` and `plan` have always read a fleet file so."""
        return SingleHost(lambda: self.as_single.ref, profile=self.profile,
                          origin=Origin(trust_new_host=self.trust_new_host))

    def render(self, as_json: bool = False, note: Out | None = None) -> str:
        return self._one().render(as_json, note)

    def plan(self, model_config: Path | None = None) -> PlanReport:
        """Each replica's plan on its host (one after another), and the router's environment (router.install)
        resolved on its host; nothing is built or started. With `engine.weights`, the first replica on each host
        says what the fetch or push would take there (a fleet fetches once per host)."""
        self._no_host("plan")
        fleet = fleet_of(self.profile)
        hosts: set[str] = set()
        plans = []
        for m in fleet.replicas:
            plans.append((m.tag, self._replica_plan(m, model_config, weights=m.host not in hosts)))
            hosts.add(m.host)
        router = fleet.router
        if router is None or router.router.install is None:
            return FleetPlan(plans).plan_report()
        try:
            env = plan_router(router, self.trust_new_host, _quiet)
        except DeployError as exc:
            return FleetPlan(plans, router.host, router_problem=str(exc)).plan_report()
        return FleetPlan(plans, router.host, env).plan_report()

    def _replica_plan(self, member: ReplicaMember, model_config: Path | None,
                      weights: bool = True) -> PlanReport | DeployError:
        t = member.profile.target
        ref = Ref(member.name, spec_of(t, self.trust_new_host), t.workdir, member.profile)
        single = SingleHost(lambda: ref, profile=member.profile, origin=Origin(trust_new_host=self.trust_new_host))
        try:
            return single.planned(model_config, None if weights else _no_weights)
        except DeployError as exc:  # the host unreachable, its lock, ...: that replica's problem, the others shown
            return exc

    def prepare(self, emit: EventSink) -> PrepareReport:
        """Every replica's host, and the router's environment (router.install) on its host."""
        self._no_host("prepare")
        fleet = fleet_of(self.profile)
        members = [(m.profile.target.host, m.name, m.profile) for m in fleet.replicas]
        more = [prepare_router(fleet.router, self.trust_new_host)] \
            if fleet.router is not None and fleet.router.router.install is not None else []
        return prepare_all(self.profile.name, members, self.trust_new_host, emit, more)

    def status(self) -> FleetStatus:
        self._no_host("status")
        data, code = fleet_status(fleet_of(self.profile), self.trust_new_host)
        return FleetStatus(data, code)

    def logs(self, opts: LogOptions, out: Out) -> None:
        fleet = fleet_of(self.profile)
        member = pick_member(fleet, replica=self.select.replica, host=self.host, router=self.select.router)
        fleet_logs(member, opts, out, trust_new_host=self.trust_new_host)

    def member(self, select: Select) -> Deployment:
        if select.whole:
            return self
        chosen = pick_member(fleet_of(self.profile), replica=select.replica, host=None, router=select.router)
        ref = member_ref(chosen, self.trust_new_host)
        return SingleHost(lambda: ref, origin=Origin(chosen.name, trust_new_host=self.trust_new_host))

    def history(self) -> HistoryReport:
        return self.as_single.history()

    def diagnose(self, engine_version: str | None = None) -> DiagnosisReport:
        return self.as_single.diagnose(engine_version)

    def down(self, opts: DownOptions = DownOptions()) -> FleetDown:
        self._no_host("down")
        result = fleet_down(fleet_of(self.profile), opts.grace, trust_new_host=self.trust_new_host,
                            break_lock=opts.break_lock, emit=opts.emit or _quiet)
        return FleetDown(result)

    def restart(self, opts: UpOptions, emit: EventSink) -> FleetReport:
        return fleet_restart(self.profile, opts, emit)

    def rollback(self, opts: UpOptions, emit: EventSink) -> FleetReport:
        return fleet_rollback(self.profile, opts, emit)

    def prune(self, opts: PruneOptions = PruneOptions()) -> PruneReport:
        return self.as_single.prune(opts)

    def smoke(self, opts: SmokeOptions, emit: EventSink) -> FleetSmokeReport:
        return smoke_fleet(self.profile, opts, emit)

    def export_source(self) -> ExportSource:
        return ExportSource(self.profile)

    def scrape_targets(self, address_of: AddressOf | None = None) -> PromExport:
        return fleet_targets(self.profile, address_of or written_address)
