"""The typed reports the Deployment methods return: each gives exactly the JSON the CLI prints (`to_json()`)
and the command's exit code (`exit_code`); most also give their text for people (`lines()`: the `Renders` protocol,
printed by deployer.output.text, which keeps a form by type only for what depends on the terminal or a live sink).
Never chosen by the kind of deployment.

`up`, `restart` and `rollback` return an `UpResult` (the runner's UpReport for a single host or a node group, the
fleet's FleetReport); `smoke` a `Smoked` (deployer.smoke's SmokeReport, the fleet's FleetSmokeReport); `plan` a
PlanReport around the kind's own plan (`KindPlan`). These are protocols, so this module (below the kinds) names no
kind's report type.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, Union

from deployer.engines.base import GpuBudget, KvAllocated
from deployer.errors import DeployError, PreflightFailed
from deployer.logtext import size_text
from deployer.operate.deployment import worst_exit_code
from deployer.operate.rows import DownResult, HistoryEntry, StatusRow

if TYPE_CHECKING:
    from deployer.preflight.checks import PreflightReport
    from deployer.prepare.environment import EnvPrepared
    from deployer.prepare.pushed import WeightsNeeded
    from deployer.smoke import Smoked

    SmokeResult = Smoked

Row = dict[str, Any]


class Renders(Protocol):
    """A report that gives its own text for people: the lines deployer.output.text prints (on stderr where
    `text_on_stderr` says so: a fleet's up report, beside its event lines)."""

    def lines(self) -> list[str]: ...


class UpResult(Protocol):
    """What `up`, `restart` and `rollback` return: the runner's UpReport (a single host, a node group) or a fleet's
    FleetReport. Shown by its type (deployer.output.text_runs); the interface needs its JSON form."""

    def to_json(self) -> dict[str, Any]: ...


class KindPlan(Protocol):
    """A kind's own plan inside a PlanReport: a host's PreflightReport, a node group's NodesPlanReport, FleetPlan."""

    def to_json(self) -> Any: ...


@dataclass(frozen=True)
class HostStatus:
    """`status` of one deployment on one host (`one`), or of every deployment on a host."""

    rows: list[StatusRow]
    one: bool = True
    host: str = ""                  # every deployment on a host: the host, and the workdirs searched on it
    looked: tuple[str, ...] = ()

    def to_json(self) -> Any:
        """One deployment: the deployment shape (`deployment_json`) with its row's keys at the top as well (what
        `status NAME --json` printed before the shape was shared); every deployment on a host: a list of them."""
        shown = [{**row.to_json(), **deployment_json(row.name, "single", [row.to_json()], worst_exit_code([row]))}
                 for row in self.rows]
        return shown[0] if self.one else shown

    @property
    def nothing_found(self) -> str | None:
        """One line saying where a host-wide status looked when it found no deployment there (else None)."""
        if self.one or self.rows or not self.looked:
            return None
        return (f"no deployments on {self.host} under {', '.join(self.looked)} (the workdir given or the default, "
                "and every workdir the local history knows on this host)")

    def lines(self) -> list[str]:
        from deployer.deployments.status_text import row_lines

        return row_lines(self.rows)

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.rows)


@dataclass(frozen=True)
class NodeStatus:
    """`status` of a node group: a row per node (`node`, `role`, `first_crash`, `last_crash_diagnosis`)."""

    rows: list[StatusRow]

    def to_json(self) -> Any:
        members = [row.to_json() for row in self.rows]
        return deployment_json(self.rows[0].name if self.rows else "", "nodes", members, self.exit_code,
                               serving=bool(self.rows) and self.rows[0].serving)

    def lines(self) -> list[str]:
        from deployer.deployments.status_text import node_lines

        return node_lines(self.rows)

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.rows)


@dataclass(frozen=True)
class FleetMember:
    """One member of a fleet's status, typed: its place (`role` replica or router, `index`, `tag` r0.. / router, the
    `host` the profile names), status's row of it (None when there is none: `status` absent or unreachable, `error`
    why) and its drift."""

    role: str
    index: int | None
    tag: str
    name: str
    host: str
    status: str
    row: StatusRow | None = None
    error: str | None = None

    @classmethod
    def of(cls, row: Row) -> FleetMember:
        """From the member's `deploy status --json` row: a whole row read through StatusRow."""
        try:
            typed: StatusRow | None = StatusRow.of(row)
        except (KeyError, TypeError, ValueError):
            typed = None   # absent, unreachable: only what the fleet knows of the member
        index = row.get("index")
        return cls(role=str(row.get("role") or "replica"), index=None if index is None else int(index),
                   tag=str(row.get("member") or ""), name=str(row.get("name") or ""),
                   host=str(row.get("alias") or row.get("host") or ""), status=str(row.get("status") or "unknown"),
                   row=typed, error=None if row.get("error") is None else str(row["error"]))

    @property
    def drift(self) -> tuple[str, ...]:
        return () if self.row is None else tuple(self.row.drift)


@dataclass(frozen=True)
class FleetStatus:
    """`status` of a replica fleet: every member's row and the fleet's code (9: partly serving); `members` reads
    them typed (the replicas, then the router)."""

    data: Row
    code: int

    @property
    def members(self) -> list[FleetMember]:
        return [FleetMember.of(row) for row in fleet_member_rows(self.data)]

    def to_json(self) -> Any:
        """The deployment shape, its members the replicas (still under `replicas` too, as before the shape was
        shared)."""
        replicas = list(self.data.get("replicas") or [])
        shared = deployment_json(str(self.data.get("name", "")), "fleet", replicas, self.code,
                                 router=self.data.get("router"), serving=bool(self.data.get("serving")))
        return {**self.data, **shared}

    def lines(self) -> list[str]:
        from deployer.deployments.status_text import fleet_lines

        return fleet_lines(self.data)

    @property
    def exit_code(self) -> int:
        return self.code


StatusReport = Union[HostStatus, NodeStatus, FleetStatus]


def fleet_member_rows(data: Row) -> list[Row]:
    """A fleet status's member rows as its JSON holds them: the replicas, then the router when it has one."""
    return [*(data.get("replicas") or ()), *([data["router"]] if data.get("router") else [])]


def deployment_json(name: str, kind: str, members: list[Row], code: int, *, router: Row | None = None,
                    serving: bool | None = None) -> Row:
    """The one shape `deploy status NAME --json` has for every kind (docs/json.md): the deployment's `name` and
    `kind` (`single`, `nodes`, `fleet`), whether it `serving` (a node group: rank 0, whose API serves; a fleet:
    every replica serving), `healthy` (every member, and a fleet's router, healthy), `code` (the command's exit
    code), its `members` (a single host: its one row; a node group: a row per node; a fleet: a row per replica)
    and a fleet's `router` row (else null)."""
    everyone = [*members, *([router] if router else [])]
    return {"name": name, "kind": kind,
            "serving": bool(members) and all(m.get("serving") for m in members) if serving is None else serving,
            "healthy": bool(everyone) and all(m.get("healthy") for m in everyone), "code": code,
            "members": members, "router": router}


def down_json(name: str, kind: str, members: list[Row], *, router: Row | None = None) -> Row:
    """The one shape `deploy down NAME --json` has for every kind (docs/json.md), the status shape's twin: the
    deployment's `name` and `kind`, `was_running` (any member's engine, or a fleet's router, was running),
    `stopped` (every member, and a fleet's router, is stopped or absent now), `code` (0: `down` raises on a host
    it could not stop), its `members` (a single host: its one row; a node group: a row per node; a fleet: a row
    per replica) and a fleet's `router` row (else null)."""
    everyone = [*members, *([router] if router else [])]
    return {"name": name, "kind": kind, "was_running": any(m.get("was_running") for m in everyone),
            "stopped": all(m.get("status") in ("stopped", "absent", None) for m in everyone), "code": 0,
            "members": members, "router": router}


@dataclass(frozen=True)
class HostDown:
    """`down` of a single host: what it did there."""

    result: DownResult

    def to_json(self) -> Any:
        """The down shape (`down_json`) with the row's keys at the top as well (what `down NAME --json` printed
        before the shape was shared)."""
        row = self.result.to_json()
        return {**row, **down_json(self.result.name, "single", [row])}

    def lines(self) -> list[str]:
        return [f"{self.result.name}: {_stopped(self.result.was_running)} on {self.result.host}"]

    exit_code = 0


@dataclass(frozen=True)
class NodeDown:
    """`down` of a node group: a row per node (with `node`)."""

    results: list[DownResult]

    def to_json(self) -> Any:
        return down_json(self.results[0].name if self.results else "", "nodes",
                         [result.to_json() for result in self.results])

    def lines(self) -> list[str]:
        return [f"{r.name} node {r.node}: {_stopped(r.was_running)} on {r.host}" for r in self.results]

    exit_code = 0


@dataclass(frozen=True)
class FleetDown:
    """`down` of a replica fleet: the router's row and every replica's (`role`, `member`, `alias`)."""

    result: Row

    def to_json(self) -> Any:
        """The down shape, its members the replicas, the router's row apart (as `status` has them)."""
        rows = list(self.result.get("members") or [])
        routers = [row for row in rows if row.get("role") == "router"]
        return down_json(str(self.result.get("name", "")), "fleet", [row for row in rows if row not in routers],
                         router=routers[0] if routers else None)

    def lines(self) -> list[str]:
        """A line per member, the router first (as it was stopped)."""
        return [f"{row['member']}@{row.get('alias') or row['host']}: {row['name']} {_stopped(row.get('was_running'))}"
                for row in self.result["members"]]

    exit_code = 0


def _stopped(was_running: Any) -> str:
    return "stopped" if was_running else "not running"


DownReport = Union[HostDown, NodeDown, FleetDown]


@dataclass(frozen=True)
class HistoryReport:
    """Every attempt (and lock event) of a deployment, newest first."""

    entries: list[HistoryEntry]

    def to_json(self) -> Any:
        return [entry.to_json() for entry in self.entries]

    def lines(self) -> list[str]:
        from deployer.deployments.history_text import history_lines

        return history_lines(self.entries)

    exit_code = 0


@dataclass(frozen=True)
class DiagnosisReport:
    """The diagnosis of a deployment's latest failed attempt (or of a log file)."""

    data: Row

    def to_json(self) -> Any:
        return self.data

    def lines(self) -> list[str]:
        from deployer.deployments.history_text import diagnosis_lines

        return diagnosis_lines(self.data)

    exit_code = 0


@dataclass(frozen=True)
class PruneReport:
    """What `prune` deleted (or, with `dry_run`, would): runs, env files, pushed model dirs; and what it kept, why."""

    result: Row
    dry_run: bool = False

    def to_json(self) -> Any:
        return self.result

    def lines(self) -> list[str]:
        result, dry_run = self.result, self.dry_run
        verb = "would delete" if dry_run else "deleted"
        out = [f"{result['name']} on {result['host']}: {result['runs']} runs, keeping the newest {result['keep']}"
               f"{' (dry run: nothing changed)' if dry_run else ''}"]
        out += [f"  {verb} run {run_id}" for run_id in result["delete"]]
        out += [f"  {verb} the env file of run {run_id}" for run_id in result["drop_env"]]
        out += [f"  kept run {run_id}: {why}" for run_id, why in result["protected"].items()]
        out += [f"  {verb} the supervisor payload {digest[:12]} (nothing names it)"
                for digest in result.get("drop_payloads") or ()]
        models = result.get("models") or {}
        out += [f"  {verb} the pushed model dir {content[:12]} (no kept run loads it)"
                for content in models.get("removed") or ()]
        out += [f"  kept the pushed model dir {content[:12]}: pushed or reused within a day"
                for content in models.get("recent") or ()]
        if models.get("removed"):
            out.append(f"  {size_text(models.get('freed_bytes') or 0)} {'to free' if dry_run else 'freed'} by the "
                       "model dirs")
        if not (result["delete"] or result["drop_env"] or result.get("drop_payloads") or models.get("removed")):
            out.append("  nothing to prune")
        return out

    exit_code = 0


@dataclass(frozen=True)
class MemoryPicture:
    """The memory plan as `plan` draws it: each GPU's budget, deployer's KV estimate, and what the running
    version's engine allocated (its log; run `run_id`)."""

    gpus: list[GpuBudget]
    estimate: KvAllocated | None = None
    allocated: KvAllocated | None = None
    run_id: str | None = None

    @classmethod
    def of(cls, preflight: PreflightReport | None) -> MemoryPicture | None:
        """From a preflight report (a node group's: node 0's); None when there is nothing to draw."""
        if preflight is None or (preflight.memory is None and preflight.allocated is None):
            return None
        estimate = preflight.memory.kv_estimate() if preflight.memory is not None else None
        return cls(preflight.gpu_budgets(), estimate, preflight.allocated, preflight.allocated_run)


@dataclass(frozen=True)
class PlanReport:
    """`plan`: the preflight report (one host) or the node group's (node 0's preflight plus a line per node);
    `error` is what the command then raises (a flag nothing may fix, or the problems found); `picture` the memory
    plan to draw."""

    report: KindPlan
    text: str
    error: DeployError | None = field(default=None)
    picture: MemoryPicture | None = None
    environment: EnvPrepared | None = field(default=None)   # engine.install: what would be installed, the disk
    # engine.weights: what the fetch would take, one per host (a fleet's hosts, a node group's nodes)
    weights: list[WeightsNeeded] = field(default_factory=list)

    def to_json(self) -> Any:
        data = self.report.to_json()
        if self.environment is not None and isinstance(data, dict):
            data = {**data, "environment": self.environment.to_json()}
        if self.weights and isinstance(data, dict):  # `weights`: the first host's, as before there were several
            data = {**data, "weights": self.weights[0].to_json(), "weights_hosts": [w.to_json() for w in self.weights]}
        return data

    @property
    def exit_code(self) -> int:
        return 0 if self.error is None else self.error.exit_code


@dataclass(frozen=True)
class FleetPlan:
    """`plan` of a fleet: each replica's own plan (tagged `r0@host`), and the router's environment (router.install)
    resolved on its host (`router_problem`: why it cannot be). A replica whose host cannot be planned (unreachable,
    locked) has its error instead of a plan."""

    replicas: list[tuple[str, PlanReport | DeployError]]
    router_host: str | None = None
    router_environment: EnvPrepared | None = None
    router_problem: str | None = None

    @property
    def problems(self) -> list[str]:
        out = [f"{tag}: {p}" for tag, plan in self.replicas for p in _problems_of(_error_of(plan))]
        return out + ([f"router: {self.router_problem}"] if self.router_problem else [])

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"replicas": [{"member": tag, **({"plan": plan.to_json()} if isinstance(plan, PlanReport)
                                                                else {"error": str(plan)})}
                                             for tag, plan in self.replicas],
                                "problems": self.problems}
        if self.router_environment is not None:
            data["router_environment"] = self.router_environment.to_json()
        return data

    def render_text(self) -> str:
        parts = [f"{tag}:\n{plan.text}" if isinstance(plan, PlanReport) else f"{tag}: cannot plan: {plan}\n"
                 for tag, plan in self.replicas]
        if self.router_environment is not None:
            lines = self.router_environment.lines()
            parts.append("".join(f"router ({self.router_host}): {line}\n" if i == 0 else f"{line}\n"
                                 for i, line in enumerate(lines)))
        if self.router_problem:
            parts.append(f"router ({self.router_host}): problem: {self.router_problem}\n")
        return "\n".join(parts)

    def plan_report(self) -> PlanReport:
        """As `plan` returns it: a replica's refusal (a flag nothing may fix) first, else every problem."""
        refusals = [e for e in (_error_of(p) for _, p in self.replicas)
                    if e is not None and not isinstance(e, PreflightFailed)]
        error = refusals[0] if refusals else plan_error(self.problems)
        first = self.replicas[0][1] if self.replicas else None
        picture = first.picture if isinstance(first, PlanReport) else None
        weights = [w for _, plan in self.replicas if isinstance(plan, PlanReport) for w in plan.weights]
        return PlanReport(self, self.render_text(), error, picture, weights=weights)


def _error_of(plan: PlanReport | DeployError) -> DeployError | None:
    return plan.error if isinstance(plan, PlanReport) else plan


def _problems_of(error: DeployError | None) -> list[str]:
    if error is None:
        return []
    return list(error.problems) if isinstance(error, PreflightFailed) else [error.message]


def plan_error(problems: list[str], refused: DeployError | None = None) -> DeployError | None:
    """What `plan` raises after showing its report: the refusal, else the problems, else nothing."""
    if refused is not None:
        return refused
    return PreflightFailed(problems) if problems else None


__all__ = ["DiagnosisReport", "HistoryEntry", "DownReport", "DownResult", "FleetDown", "FleetStatus", "HistoryReport", "HostDown",
           "HostStatus", "StatusRow",
           "FleetPlan", "MemoryPicture", "NodeDown", "NodeStatus", "PlanReport", "PruneReport", "Row", "SmokeResult", "StatusReport", "UpResult",
           "plan_error"]
