"""The dashboard's typed values: what a `DashboardSource` returns and what the page draws.

Field names mirror the CLI's `--json` outputs, so the page is a view of the same data:
- `OverviewRow`: one row of `deploy status` (name, host, status, serving, healthy, engine, engine_version, model,
  pid, uptime_s, restarts, crash_loop, last_crash, diagnosis, lock, unhealthy, attempt, content_hash, run_dir,
  port; a fleet member's role/member/index) plus the metrics `deploy top` shows (requests, tokens/s, KV %, p99),
  each None when absent (the page leaves it blank).
- `Attempt`: one `kind: "attempt"` row of `deploy history --json` (run_id, current, attempt, up_id, started_at,
  content_hash, outcome, detail, diagnosis, change, drift, restarts) plus its phase timeline (the watcher's
  `phase` events: phase, elapsed).
- `Rollback`: the version brought back after a failed replace (`deploy up --json`'s `restored`: run_id, status).
- `GpuMemory`: one GPU of `deploy plan --json`'s `memory` block, as stacked parts (weights / KV / Mamba state /
  graphs / other) and the headroom left (dashboard/readers.py `memory_from_plan` builds it from the plan).
- `Drift`: one flag of the effective-args diff (diagnose/drift.py's `Drift.to_json`: flag, asked, resolved, kind).
- `LogChunk`: a window of the engine log by byte offset (start, end, size), as `deploy logs --follow` reads it.

Every value has `to_json` (what the server sends) and `from_json` (what `StaticSource` and tests build from);
dashboard/readers.py reads the CLI's own `--json` outputs into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

def _opt_float(value: Any) -> float | None:
    return None if value is None or isinstance(value, bool) else float(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None or isinstance(value, bool) else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _strs(values: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in values or ())


@dataclass(frozen=True)
class Diagnosis:
    """Why an attempt failed (diagnose/diagnosis.py's `Diagnosis.to_json`, bounded as outcome.json stores it)."""

    signature: str | None                     # None: no known failure matched (the page says "unknown failure")
    summary: str = ""
    transient: bool = False
    evidence: tuple[str, ...] = ()
    hint: str | None = None
    traceback: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Diagnosis:
        return cls(signature=_opt_str(data.get("signature")), summary=str(data.get("summary") or ""),
                   transient=bool(data.get("transient")), evidence=_strs(data.get("evidence")),
                   hint=_opt_str(data.get("hint")), traceback=_opt_str(data.get("traceback")))


@dataclass(frozen=True)
class LastCrash:
    """How and when the engine last ended (status's `last_crash`: exit code or signal, epoch seconds)."""

    at: float | None = None
    exit_code: int | None = None
    signal_name: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LastCrash:
        return cls(at=_opt_float(data.get("at")), exit_code=_opt_int(data.get("exit_code")),
                   signal_name=_opt_str(data.get("signal_name")))


@dataclass(frozen=True)
class OverviewRow:
    """One deployment, fleet replica or router, or node of a node group, as the overview lists it: every field
    `deploy status` shows of it (dashboard/readers.py `row_of_status` reads them from its typed row)."""

    key: str                                  # the deployment page's address (unique within the source)
    name: str
    host: str
    status: str                               # the supervisor's state: ready, running, crashed, crashloop, ...
    serving: bool = False
    healthy: bool = False
    kind: str = "deployment"                  # deployment | replica | router | node
    engine: str | None = None                 # the engine kind as the record names it (or "stand-in")
    engine_version: str | None = None         # as the run's profile names it
    model: str | None = None                  # the model name it serves
    pid: int | None = None
    uptime_s: float | None = None
    restarts: int | None = None
    crash_loop: bool = False                  # the supervisor stopped restarting it (restart.max within window_s)
    last_crash: LastCrash | None = None
    diagnosis: Diagnosis | None = None        # of the last failure (the run's, else its last crash's)
    lock: str | None = None                   # who holds the deployment's lock, as status says it
    unhealthy: str | None = None              # why the supervisor's last one-token probe failed
    attempt: int | None = None
    content_hash: str | None = None
    run_dir: str | None = None
    port: int | None = None
    member: str | None = None                 # a fleet member's tag / a node's rank, as `status --json` has it
    requests: int | None = None
    tokens_per_s: float | None = None
    kv_usage_pct: float | None = None
    p99_latency_ms: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OverviewRow:
        crash, diag = data.get("last_crash"), data.get("diagnosis")
        return cls(
            key=str(data["key"]), name=str(data["name"]), host=str(data.get("host", "")),
            status=str(data.get("status", "unknown")), serving=bool(data.get("serving")),
            healthy=bool(data.get("healthy")), kind=str(data.get("kind", "deployment")),
            engine=_opt_str(data.get("engine")),
            engine_version=_opt_str(data.get("engine_version", data.get("version"))),
            model=_opt_str(data.get("model")), pid=_opt_int(data.get("pid")),
            uptime_s=_opt_float(data.get("uptime_s")), restarts=_opt_int(data.get("restarts")),
            crash_loop=bool(data.get("crash_loop")),
            last_crash=LastCrash.from_json(crash) if isinstance(crash, Mapping) else None,
            diagnosis=Diagnosis.from_json(diag) if isinstance(diag, Mapping) else None,
            lock=_opt_str(data.get("lock")), unhealthy=_opt_str(data.get("unhealthy")),
            attempt=_opt_int(data.get("attempt")), content_hash=_opt_str(data.get("content_hash")),
            run_dir=_opt_str(data.get("run_dir")), port=_opt_int(data.get("port")), member=_opt_str(data.get("member")),
            requests=_opt_int(data.get("requests")), tokens_per_s=_opt_float(data.get("tokens_per_s")),
            kv_usage_pct=_opt_float(data.get("kv_usage_pct")), p99_latency_ms=_opt_float(data.get("p99_latency_ms")),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Phase:
    """One phase an attempt reached, `elapsed` seconds after its launch (the watcher's `phase` event)."""

    phase: str
    elapsed: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Phase:
        return cls(phase=str(data["phase"]), elapsed=float(data.get("elapsed", 0.0)))


@dataclass(frozen=True)
class Change:
    """What a heal changed in the profile after an attempt (remedy.py's `Change.to_json`; None = removed)."""

    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str | None] = field(default_factory=dict)
    reason: str = ""
    basis: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        return cls(args=dict(data.get("args") or {}), env=dict(data.get("env") or {}),
                   reason=str(data.get("reason") or ""), basis=dict(data.get("basis") or {}))


@dataclass(frozen=True)
class Attempt:
    """One attempt of `deploy up` (a history row), with its phases, diagnosis and the change made after it."""

    run_id: str
    outcome: str                              # ready | crashed | hung | timeout | ...
    attempt: int | None = None
    current: bool = False
    up_id: str | None = None
    started_at: float | None = None
    elapsed_s: float | None = None            # how long it ran until its outcome
    content_hash: str | None = None
    detail: str | None = None
    restarts: int = 0
    phases: tuple[Phase, ...] = ()
    diagnosis: Diagnosis | None = None
    change: Change | None = None
    drift: tuple[str, ...] = ()

    @property
    def healed(self) -> bool:
        """A change was made after this attempt (the next one ran with it)."""
        return self.change is not None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        diag, change = data.get("diagnosis"), data.get("change")
        return cls(
            run_id=str(data["run_id"]), outcome=str(data.get("outcome", "unknown")),
            attempt=_opt_int(data.get("attempt")), current=bool(data.get("current")),
            up_id=_opt_str(data.get("up_id")), started_at=_opt_float(data.get("started_at")),
            elapsed_s=_opt_float(data.get("elapsed_s")), content_hash=_opt_str(data.get("content_hash")),
            detail=_opt_str(data.get("detail")), restarts=int(data.get("restarts") or 0),
            phases=tuple(Phase.from_json(p) for p in data.get("phases") or ()),
            diagnosis=Diagnosis.from_json(diag) if isinstance(diag, Mapping) else None,
            change=Change.from_json(change) if isinstance(change, Mapping) else None,
            drift=_strs(data.get("drift")),
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "healed": self.healed}


@dataclass(frozen=True)
class Rollback:
    """A version brought back after the attempts failed (`restored`: the run serving again and its status)."""

    run_id: str
    status: str
    at: float | None = None
    reason: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rollback:
        return cls(run_id=str(data["run_id"]), status=str(data.get("status", "")), at=_opt_float(data.get("at")),
                   reason=_opt_str(data.get("reason")))


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the plan divides it (MiB): the parts stacked from the bottom, then the headroom."""

    gpu: int
    total_mib: float
    weights_mib: float = 0.0
    kv_mib: float = 0.0
    mamba_mib: float = 0.0
    graphs_mib: float = 0.0
    other_mib: float = 0.0                    # activations, CUDA context, NCCL, what the engine reserves
    name: str | None = None
    fits: bool = True

    @property
    def headroom_mib(self) -> float:
        return self.total_mib - self.used_mib

    @property
    def used_mib(self) -> float:
        return self.weights_mib + self.kv_mib + self.mamba_mib + self.graphs_mib + self.other_mib

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuMemory:
        return cls(gpu=int(data["gpu"]), total_mib=float(data["total_mib"]),
                   weights_mib=float(data.get("weights_mib", 0.0)), kv_mib=float(data.get("kv_mib", 0.0)),
                   mamba_mib=float(data.get("mamba_mib", 0.0)), graphs_mib=float(data.get("graphs_mib", 0.0)),
                   other_mib=float(data.get("other_mib", 0.0)), name=_opt_str(data.get("name")),
                   fits=bool(data.get("fits", True)))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "headroom_mib": self.headroom_mib}


@dataclass(frozen=True)
class Drift:
    """One flag whose effective value differs from the profile's ("changed"), or that the engine does not report
    ("unknown"): the effective-args diff."""

    flag: str
    asked: Any
    resolved: Any = None
    kind: str = "changed"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Drift:
        return cls(flag=str(data["flag"]), asked=data.get("asked"), resolved=data.get("resolved"),
                   kind=str(data.get("kind", "changed")))


@dataclass(frozen=True)
class DeploymentDetail:
    """Everything the deployment page shows: its overview row, attempts oldest first, rollbacks, memory, drift."""

    row: OverviewRow
    attempts: tuple[Attempt, ...] = ()
    rollbacks: tuple[Rollback, ...] = ()
    memory: tuple[GpuMemory, ...] = ()
    drift: tuple[Drift, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeploymentDetail:
        return cls(row=OverviewRow.from_json(data["row"]),
                   attempts=tuple(Attempt.from_json(a) for a in data.get("attempts") or ()),
                   rollbacks=tuple(Rollback.from_json(r) for r in data.get("rollbacks") or ()),
                   memory=tuple(GpuMemory.from_json(g) for g in data.get("memory") or ()),
                   drift=tuple(Drift.from_json(d) for d in data.get("drift") or ()))

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row.to_json(), "attempts": [a.to_json() for a in self.attempts],
                "rollbacks": [asdict(r) for r in self.rollbacks], "memory": [g.to_json() for g in self.memory],
                "drift": [asdict(d) for d in self.drift]}


@dataclass(frozen=True)
class LogRequest:
    """Which part of the log: from byte `offset` on (follow), or the last `max_bytes` when `offset` is None."""

    offset: int | None = None
    max_bytes: int = 64 << 10


@dataclass(frozen=True)
class LogChunk:
    """Complete lines of the engine log between byte offsets `start` and `end` (ask from `end` to follow);
    `size` the log's size now, `run_id` the run it belongs to (a new run starts a new log)."""

    lines: tuple[str, ...]
    start: int
    end: int
    size: int
    run_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
