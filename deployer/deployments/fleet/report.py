"""What a fleet operation reports: per replica (ready, already running, failed and why) and the router."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import DeployError, LaunchFailed, PartlyFailed
from deployer.logtext import shown
from deployer.deployments.fleet.canary_judge import Verdict
from deployer.deployments.fleet.members import ReplicaMember
from deployer.deployments.fleet.router import RouterReport

SERVING = ("ready", "already-running", "unchanged")
# a replica not replaced (left running) or whose old version is back (a canary rolled back) serves too
STILL_SERVING = (*SERVING, "left-running", "rolled-back")


def serves(status: str, restored: dict[str, Any] | None) -> bool:
    """Whether a replica with this report status (and the version brought back, if any) serves."""
    return status in STILL_SERVING or (restored or {}).get("status") == "ready"


@dataclass
class ReplicaResult:
    index: int
    host: str
    name: str
    url: str
    status: str           # ready | already-running | unchanged | failed | skipped | left-running (not replaced)
    run_dir: str | None = None
    content_hash: str | None = None
    error: str | None = None
    exit_code: int | None = None
    diagnosis: dict[str, Any] | None = None
    restored: dict[str, Any] | None = None       # the version brought back after a failed replace
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def serving(self) -> bool:
        return serves(self.status, self.restored)


@dataclass
class FleetReport:
    name: str
    status: str = "failed"                       # ready | partial | failed
    mode: str = "fan-out"                        # fan-out | rolling | canary
    replicas: list[ReplicaResult] = field(default_factory=list)
    router: RouterReport | None = None
    notes: list[str] = field(default_factory=list)
    restart: dict[str, Any] | None = None        # what each replica's supervisor does with a crash after ready
    canary: Verdict | None = None                # a canary rollout's verdict with its numbers (canary.py)
    outcome: str | None = None                   # a canary rollout's: promoted | rolled-back | stopped | unchanged

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["router"] = self.router.to_json() if self.router else None
        return data

    def serving_urls(self) -> list[str]:
        return [r.url for r in self.replicas if r.serving]

    text_on_stderr = True   # beside the events' lines, which go to stderr too (stdout: --json's NDJSON only)

    def lines(self) -> list[str]:
        """The report for people (deployer.cli.show.text prints them)."""
        return report_lines(self.to_json())

    def settle(self) -> FleetReport:
        """The fleet's status from its members'; raises when not everything is ready (the report travels along)."""
        ready = [r for r in self.replicas if r.status in SERVING]
        router_ok = self.router is None or self.router.status == "ready"
        if len(ready) == len(self.replicas) and router_ok:
            self.status = "ready"
            return self
        failed = [r for r in self.replicas if r.status not in SERVING]
        parts = [f"r{r.index}@{r.host}: {r.error or r.status}" for r in failed]
        if not router_ok and self.router is not None:
            parts.append(f"router@{self.router.host}: {self.router.detail or self.router.status}")
        summary = f"{len(ready)} of {len(self.replicas)} replicas ready"
        if any(r.serving for r in self.replicas):  # something serves: partial failure (exit 9)
            self.status = "partial"
            raise PartlyFailed(f"{self.name}: {summary}; " + "; ".join(parts), outcome=self)
        self.status = "failed"
        error = LaunchFailed(f"{self.name}: {summary}; " + "; ".join(parts), outcome=self)
        codes = {r.exit_code for r in failed}
        if len(codes) == 1 and None not in codes:  # every host failed the same way (all unreachable: 3)
            error.exit_code = int(codes.pop() or LaunchFailed.exit_code)
        raise error


def replica_result(member: ReplicaMember, report: Any) -> ReplicaResult:
    """From the single-host UpReport of this replica."""
    return ReplicaResult(member.index, member.host, member.name, member.url, report.status, report.run_dir,
                         report.content_hash, attempts=[a.to_json() for a in report.attempts],
                         restored=_restored(report))


def failed_result(member: ReplicaMember, exc: DeployError) -> ReplicaResult:
    """A replica whose work failed: the error line, its exit code, and the last attempt's diagnosis if any."""
    outcome = getattr(exc, "outcome", None)
    attempts = [a.to_json() for a in getattr(outcome, "attempts", [])]
    diagnosis = next((a.get("diagnosis") for a in reversed(attempts) if a.get("diagnosis")), None)
    return ReplicaResult(member.index, member.host, member.name, member.url, "failed", error=exc.message,
                         exit_code=exc.exit_code, diagnosis=diagnosis, attempts=attempts,
                         restored=_restored(outcome))


def _restored(report: Any) -> dict[str, Any] | None:
    """An UpReport's restored version as the fleet report holds it."""
    restored = getattr(report, "restored", None)
    return None if restored is None else restored.to_json()


def report_lines(report: dict[str, Any]) -> list[str]:
    """The fleet report (FleetReport.to_json()) for people: a line per replica and the router, then the verdict."""
    lines = [f"{report['name']} ({report['mode']}):"]
    for r in report["replicas"]:
        where = f"r{r['index']}@{r['host']}"
        line = f"  {where:<20} {r['status']:<16} {r['url']}"
        if r.get("error"):
            line += f"  {shown(r['error'], 300)}"
        lines.append(line)
        diag = r.get("diagnosis") or {}
        if diag:
            lines.append(f"  {'':<20} diagnosis {diag.get('signature') or 'unknown'}: {shown(diag.get('summary', ''))}")
        restored = r.get("restored") or {}
        if restored:
            lines.append(f"  {'':<20} previous version {str(restored.get('content_hash'))[:12]} brought back: "
                         f"{restored.get('status')}")
    router = report.get("router")
    if router:
        where = f"router@{router['host']}"
        line = f"  {where:<20} {router['status']:<16} {router.get('url') or ''}"
        if router.get("status") == "ready":
            line += f"  {len(router.get('workers') or [])} workers ({router.get('action')})"
        elif router.get("detail"):
            line += f"  {shown(router['detail'], 300)}"
        lines.append(line)
    for note in report.get("notes") or []:
        lines.append(f"  {shown(note, 300)}")
    for check in (report.get("canary") or {}).get("checks") or []:  # a canary's gates (deployments/fleet/canary_judge.py)
        verdict = {True: "ok", False: "FAILED", None: "not compared"}[check.get("passed")]
        lines.append(f"    {check['name']}: {verdict} ({shown(check.get('note') or '', 200)})")
    ready = sum(1 for r in report["replicas"] if serves(r["status"], r.get("restored")))
    lines.append(f"{report['name']}: {report['status']} ({ready} of {len(report['replicas'])} replicas serving)")
    if (report.get("restart") or {}).get("text"):
        lines.append(f"  each replica: {shown(report['restart']['text'], 300)}")
    return lines
