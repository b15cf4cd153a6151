"""A deployment on one host: the single-host runner (`up`), preflight, on-call (status, logs, down, history,
diagnose, prune, restart, rollback) and smoke, each the existing use case on one Ref.

A bare name that is no deployment on --host may be the fleet whose router runs there (its record, fleet.json):
`status` and `down` then answer for that fleet (`fleet_here`).

Only on-call's reads are imported at the top: `deploy status NAME` is what on-call runs most, and the runner,
preflight, render and smoke modules were most of its start-up; each method that changes an engine imports its
use case where it runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.deployments.base import Deployment, DownOptions, ExportSource, LogOptions, Out, PruneOptions
from deployer.deployments.reports import (DiagnosisReport, DownReport, HistoryReport, HostDown, HostStatus,
                                          MemoryPicture, PlanReport, PruneReport, StatusReport, plan_error)
from deployer.errors import NotFound, ProfileError
from deployer.operate import deployment as ops

if TYPE_CHECKING:
    from deployer.runner.up import UpOptions, UpReport
    from deployer.profile.model import Profile
    from deployer.smoke import SmokeOptions, SmokeReport
    from deployer.events import EventSink
    from deployer.export.prometheus import AddressOf, PromExport
    from deployer.box.snapshot import LogWindow
    from deployer.prepare.report import PrepareReport
    from deployer.operate.upgrade.outcome import Upgraded
    from deployer.operate.upgrade.plan import UpgradeOptions
    from deployer.prepare.pushed import WeightsNeeded
    from deployer.remote.base import Remote

    # For `plan`: what the weights would take (a line per host) and the problems, given a connection and the profile.
    WeightsOf = Callable[[Remote, Profile], tuple[list[WeightsNeeded], list[str]]]


@dataclass(frozen=True)
class Origin:
    """Where a deployment was named: the profile file (with its --set overrides) or the name, and --host.
    `up` remembers a file it loaded (the on-call commands on it need not load it again)."""

    arg: str | None = None
    host: str | None = None
    workdir: str | None = None
    trust_new_host: bool = False
    overrides: tuple[str, ...] = ()


RefOf = Callable[[], ops.Ref]
FleetHere = Callable[[], "Deployment | None"]


def _no_fleet() -> Deployment | None:
    return None


def _as_pushed(profile: Profile) -> tuple[Profile, list[str]]:
    """For `render`: a profile that pushes its model directory as it launches after the push (the engine loads the
    copy under the workdir, keyed by the directory's content, hashed here), and the line that says so."""
    from deployer.prepare.pushed import pinned_to_copy
    from deployer.runner.weights import push_cache

    at_copy = pinned_to_copy(profile, profile.target.workdir, push_cache())
    if at_copy is None:
        return profile, []
    pinned, plan, folder = at_copy
    where = "" if folder.startswith("/") else " (~ as the target's user expands it)"
    return pinned, [f"engine.weights.push: the engine loads the copy of {plan.source} pushed to {folder}{where}"]


class SingleHost(Deployment):
    """One engine on one host."""

    def __init__(self, ref_of: RefOf, *, profile: Profile | None = None, origin: Origin = Origin(),
                 fleet_here: FleetHere = _no_fleet, load_error: ProfileError | None = None) -> None:
        self._ref_of: RefOf = ref_of
        self._ref: ops.Ref | None = None
        self.profile, self.origin, self.fleet_here, self.load_error = profile, origin, fleet_here, load_error
        self.name = profile.name if profile is not None else origin.arg

    @property
    def ref(self) -> ops.Ref:
        """Which deployment on which host (made when first needed: a profile file is loaded once)."""
        if self._ref is None:
            self._ref = self._ref_of()
        return self._ref

    def _profile(self) -> Profile:
        if self.profile is None and self.load_error is None and self.origin.arg and \
                self.origin.arg.endswith((".yaml", ".yml")):
            self.profile = self.ref.profile  # named by its file: the Ref loaded it
        if self.profile is None:
            raise self.load_error or ProfileError("this command needs a profile file")
        return self.profile

    def upgrade(self, opts: UpgradeOptions, apply_it: bool, emit: EventSink) -> Upgraded:
        """The plan on this host; `apply_it`: the switch, load-checked against the old release (oncall.upgrade)."""
        from deployer.operate.upgrade.apply import apply_upgrade
        from deployer.operate.upgrade.outcome import Upgraded
        from deployer.operate.upgrade.plan import upgrade_plan

        prof, trust = self._profile(), self.origin.trust_new_host
        plan = upgrade_plan(prof, opts, trust, emit)
        applied = apply_upgrade(plan, prof, trust, emit) if apply_it and plan.ok else None
        return Upgraded(plan, prof, opts.python, applied)

    def up(self, opts: UpOptions, emit: EventSink) -> UpReport:
        from deployer.local.remembered import remember
        from deployer.runner.up import up

        prof = self._profile()
        if self.origin.arg is not None:
            remember(self.origin.arg, self.origin.overrides, self.origin.host, prof)
        return up(prof, opts, emit)

    def render(self, as_json: bool = False, note: Out | None = None) -> str:
        from deployer.preflight.known import for_target, local_caches
        from deployer.render.bundle import render as render_bundle

        prof, pushed = _as_pushed(self._profile())
        fit = for_target(prof, local_caches())
        for line in [*fit.notes(), *pushed]:
            if note is not None:
                note(line)
        bundle = render_bundle(fit.profile)
        if not as_json:
            return bundle.script
        # secret_sources: where each secret value will come from (field -> ${VAR} text)
        data = {"script": bundle.script, "argv": bundle.argv, "env": bundle.masked_env,
                "content_hash": bundle.content_hash, "secret_sources": fit.profile.templates,
                "unset": sorted({u.name for u in prof.unset}), "engine_version": fit.to_json()}
        return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"

    def plan(self, model_config: Path | None = None) -> PlanReport:
        return self.planned(model_config)

    def planned(self, model_config: Path | None = None, weights_of: WeightsOf | None = None) -> PlanReport:
        """`plan`; `weights_of`: what the weights would take, given this host's connection and profile (a fleet's
        asks every host; default: this host)."""
        from deployer.local.history import home
        from deployer.preflight.checks import run_preflight
        from deployer.remote.connect import conversing, target_spec
        from deployer.runner.install import engine_download_note, plan_environment, planned_weights, unbuilt_problem
        from deployer.box.push import layout_for
        from deployer.box.records import current_view, engine_allocated

        prof = self._profile()
        with conversing(target_spec(prof, self.origin.trust_new_host)) as remote:  # one exec channel
            prof, env = plan_environment(remote, prof)
            view = current_view(remote, layout_for(remote, prof))
            own_port = view is not None and view.alive and view.record.get("port") == prof.engine.port
            report = run_preflight(remote, prof, cache_dir=home() / "cache", model_config=model_config,
                                   own_port=own_port)
            if view is not None:  # after a start: what the engine really allocated, beside the estimate
                report.allocated, report.allocated_run = engine_allocated(remote, view, prof.engine.definition), \
                    view.run.run_id
            weights, weights_problem = (weights_of or planned_weights)(remote, prof)
        report.problems = [p for p in report.problems if not unbuilt_problem(p, prof, env)] + weights_problem
        lines = (env.lines() if env is not None else []) + [w.describe() for w in weights]
        lines += engine_download_note(prof) if weights_of is None else []   # once per host
        text = "".join(line + "\n" for line in lines) + report.render_text()
        return PlanReport(report, text + "\n", plan_error(report.problems, report.refusal()),
                          MemoryPicture.of(report), environment=env, weights=weights)

    def prepare(self, emit: EventSink) -> PrepareReport:
        from deployer.prepare.report import PrepareReport
        from deployer.runner.install import prepare_host

        prof = self._profile()
        return PrepareReport(prof.name, [prepare_host(prof, prof.target.host, self.origin.trust_new_host, emit)])

    def status(self) -> StatusReport:
        ref = self.ref
        if ref.name is None:  # every deployment on the host: also under each workdir the local history knows there
            from deployer.local.lookup import workdirs_on

            looked = tuple(dict.fromkeys([ref.workdir, *workdirs_on(self.origin.host or ref.spec.host)]))
            return HostStatus(ops.status(ref, also=looked), one=False, host=self.origin.host or ref.spec.host,
                              looked=looked)
        try:
            rows = ops.status(ref)
        except NotFound:
            fleet = self.fleet_here()
            if fleet is None:
                raise
            return fleet.status()
        return HostStatus(rows)

    def logs(self, opts: LogOptions, out: Out) -> None:
        ops.logs(self.ref, lines=opts.lines, follow=opts.follow, previous=opts.previous, out=out,
                 grep=opts.grep, since=opts.since)

    def known_profile(self) -> Profile | None:
        return self.profile or self.ref.profile

    def log_window(self, offset: int | None, max_bytes: int) -> LogWindow | None:
        from deployer.operate.logwindow import log_window

        return log_window(self.ref, offset, max_bytes)

    def history(self) -> HistoryReport:
        from deployer.operate import history as attempts

        return HistoryReport(attempts.history(self.ref))

    def diagnose(self, engine_version: str | None = None) -> DiagnosisReport:
        from deployer.operate import history as attempts

        return DiagnosisReport(attempts.diagnose_deployment(self.ref, engine_version))

    def down(self, opts: DownOptions = DownOptions()) -> DownReport:
        result = ops.down(self.ref, opts.grace, break_lock=opts.break_lock, notify=opts.notify)
        if result.status == "absent":  # no such deployment here: perhaps the fleet whose router runs here
            fleet = self.fleet_here()
            if fleet is not None:
                return fleet.down(opts)
        return HostDown(result)

    def restart(self, opts: UpOptions, emit: EventSink) -> UpReport:
        from deployer.operate import rollback as going_back

        return going_back.restart(self.ref, emit, opts)

    def rollback(self, opts: UpOptions, emit: EventSink) -> UpReport:
        from deployer.operate import rollback as going_back

        return going_back.rollback(self.ref, emit, opts)

    def prune(self, opts: PruneOptions = PruneOptions()) -> PruneReport:
        from deployer.operate import history as attempts

        return PruneReport(attempts.prune(self.ref, opts.keep, opts.dry_run), opts.dry_run)

    def smoke(self, opts: SmokeOptions, emit: EventSink) -> SmokeReport:
        from deployer import smoke as smoke_run

        label = Path(self.origin.arg).stem if self.origin.arg else ""
        return smoke_run.run(self.profile, opts, emit, load_error=self.load_error, label=label)

    def export_source(self) -> ExportSource:
        if self.profile is not None:
            return ExportSource(self.profile)
        from deployer.export.runs import last_ready_profile

        profile, run_id = last_ready_profile(self.ref)
        return ExportSource(profile, run_id)

    def scrape_targets(self, address_of: AddressOf | None = None) -> PromExport:
        from deployer.export.prometheus import engine_targets, written_address

        return engine_targets(self._profile(), address_of or written_address)
