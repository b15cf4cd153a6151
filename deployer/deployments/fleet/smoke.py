"""`deploy smoke` of a fleet: up (fan-out), the router, one request through the router and one to each replica,
then down; a case per member (host) and phase, for JUnit.

Phases per member: `up` (each replica, timed from its own events), `router` (ready in front of the replicas),
`request` (through the router, and straight to each replica where it listens, over its host's SSH connection),
`stop` (skipped with --keep). A failure on one host never hides the others' cases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import DeployError, LaunchFailed, PartlyFailed
from deployer.deployments.fleet.members import Fleet, fleet_of
from deployer.remote.connect import spec_of
from deployer.deployments.fleet.oncall import fleet_down
from deployer.deployments.fleet.report import SERVING, FleetReport
from deployer.deployments.fleet.up import fleet_up
from deployer.runner.up import UpOptions
from deployer.host import probe_address
from deployer.profile.model import Profile, Target
from deployer.remote.connect import conversing
from deployer.smoke import Endpoint, SmokeCase, SmokeOptions, ask
from deployer.events import BecameReady, Event, EventSink


@dataclass
class Case:
    phase: str
    member: str            # r0, r1, router
    host: str
    status: str = "skipped"    # passed | failed | skipped
    duration_s: float = 0.0
    details: str = ""


@dataclass
class FleetSmokeReport:
    name: str
    cases: list[Case] = field(default_factory=list)
    fleet: dict[str, Any] | None = None
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.status != "failed" for c in self.cases)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else (self.error.exit_code if self.error else 6)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "exit_code": self.exit_code,
                "cases": [c.__dict__ for c in self.cases], "fleet": self.fleet,
                "error": self.error.message if self.error else None}

    text_on_stderr = False

    def lines(self) -> list[str]:
        """The report for people: the verdict, then a line per member and phase."""
        out = [f"smoke {self.name} (fleet): {'ok' if self.ok else f'FAILED (exit {self.exit_code})'}"]
        for c in self.cases:
            took = f"{c.duration_s:6.2f}s" if c.status != "skipped" else " " * 7
            out.append(f"  {c.phase:<8} {c.member + '@' + c.host:<20} {c.status:<7} {took}  {c.details}")
        return out

    def smoke_cases(self) -> list[SmokeCase]:
        """One case per member (host) and phase: `up r0@gpu-a`, `request router@gpu-a`, ..."""
        return [SmokeCase(f"{c.phase} {c.member}@{c.host}", f"smoke.{self.name}.{c.host}", c.status, c.duration_s,
                          c.details, c.details) for c in self.cases]

    def properties(self) -> dict[str, str]:
        return {"exit_code": str(self.exit_code), "fleet": self.name}


class _Timing:
    """When each member's first and ready events came (its `up` case's duration)."""

    def __init__(self, emit: EventSink) -> None:
        self.emit = emit
        self.first: dict[str, float] = {}
        self.ready: dict[str, float] = {}

    def __call__(self, event: Event) -> None:
        member = event.member or ""
        now = time.monotonic()
        self.first.setdefault(member, now)
        if isinstance(event, BecameReady):
            self.ready[member] = now
        self.emit(event)

    def took(self, member: str, start: float, end: float) -> float:
        return round(self.ready.get(member, end) - start, 3)


def smoke_fleet(profile: Profile, opts: SmokeOptions, emit: EventSink) -> FleetSmokeReport:
    fleet = fleet_of(profile)
    report = FleetSmokeReport(fleet.name)
    timing = _Timing(emit)
    up_opts = UpOptions(trust_new_host=opts.trust_new_host, heal=opts.heal, skip_preflight=opts.skip_preflight,
                        force=opts.force, what="smoke", local_history=opts.local_history)
    start = time.monotonic()
    outcome: FleetReport | None = None
    try:
        outcome = fleet_up(profile, up_opts, timing)
    except (PartlyFailed, LaunchFailed) as exc:
        report.error = exc
        outcome = exc.outcome if isinstance(exc.outcome, FleetReport) else None
    except DeployError as exc:
        report.error = exc
    end = time.monotonic()
    _up_cases(fleet, report, outcome, timing, start, end)
    if outcome is not None:
        report.fleet = outcome.to_json()
        _request_cases(fleet, report, outcome, opts)
    _stop_cases(fleet, report, opts, emit)
    if report.error is None and not report.ok:
        failed = [f"{c.phase} {c.member}@{c.host}: {c.details}" for c in report.cases if c.status == "failed"]
        report.error = PartlyFailed(f"{fleet.name}: smoke failed: {'; '.join(failed)}")
    return report


def _up_cases(fleet: Fleet, report: FleetSmokeReport, outcome: FleetReport | None, timing: _Timing, start: float,
              end: float) -> None:
    results = {r.index: r for r in (outcome.replicas if outcome else [])}
    for replica in fleet.replicas:
        got = results.get(replica.index)
        case = Case("up", f"r{replica.index}", replica.host, duration_s=timing.took(f"r{replica.index}", start, end))
        if got is not None and got.status in SERVING:
            case.status, case.details = "passed", f"{got.status} at {replica.url}"
        else:
            case.status = "failed"
            case.details = (got.error if got else None) or (report.error.message if report.error else "not deployed")
        report.cases.append(case)
    if fleet.router is not None:
        router = outcome.router if outcome else None
        case = Case("router", "router", fleet.router.host, duration_s=round(end - start, 3))
        if router is not None and router.status == "ready":
            case.status, case.details = "passed", f"{len(router.workers)} workers at {router.url}"
        else:
            case.status, case.details = "failed", (router.detail if router else "not started")
        report.cases.append(case)


def _request_cases(fleet: Fleet, report: FleetSmokeReport, outcome: FleetReport, opts: SmokeOptions) -> None:
    if fleet.router is not None:
        r = fleet.router
        ready = outcome.router is not None and outcome.router.status == "ready"
        report.cases.append(_ask_case("router", r.target, Endpoint(r.router.port, probe_address(r.bind), r.api_key),
                                      opts, ready))
    served = {x.index for x in outcome.replicas if x.status in SERVING}
    for replica in fleet.replicas:
        engine = replica.profile.engine
        key = engine.args.get("api_key")
        endpoint = Endpoint(engine.port, engine.probe_address, str(key) if key else None)
        report.cases.append(_ask_case(f"r{replica.index}", replica.profile.target, endpoint, opts,
                                      replica.index in served))


def _ask_case(member: str, target: Target, endpoint: Endpoint, opts: SmokeOptions, reached: bool) -> Case:
    case = Case("request", member, target.host)
    if not reached:
        case.details = "not reached: not ready"
        return case
    t0 = time.monotonic()
    try:
        with conversing(spec_of(target, opts.trust_new_host)) as remote:
            answer = ask(remote, endpoint, opts)
    except DeployError as exc:
        case.status, case.details = "failed", exc.message
    else:
        case.status = "passed"
        case.details = f"{answer.model}: {answer.latency_ms:.0f} ms, {answer.field} {answer.text[:80]!r}"
    case.duration_s = round(time.monotonic() - t0, 3)
    return case


def _stop_cases(fleet: Fleet, report: FleetSmokeReport, opts: SmokeOptions, emit: EventSink) -> None:
    tags = [(f"r{r.index}", r.host) for r in fleet.replicas]
    if fleet.router is not None:
        tags.append(("router", fleet.router.host))
    if opts.keep:
        report.cases += [Case("stop", m, h, details="kept running (--keep)") for m, h in tags]
        return
    t0 = time.monotonic()
    errors: dict[str, str] = {}
    try:
        fleet_down(fleet, None, trust_new_host=opts.trust_new_host, emit=emit)
    except PartlyFailed as exc:
        for row in (exc.outcome or {}).get("members", []) if isinstance(exc.outcome, dict) else []:
            if row.get("status") == "failed":
                errors[str(row.get("member"))] = str(row.get("error"))
    except DeployError as exc:
        errors = {m: exc.message for m, _ in tags}
    took = round(time.monotonic() - t0, 3)
    for member, host in tags:
        failed = member in errors
        report.cases.append(Case("stop", member, host, "failed" if failed else "passed", took,
                                 errors.get(member, "stopped")))
