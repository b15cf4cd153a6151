"""The typed rows of the on-call reports: one deployment's `status` (a node's, with its node facts), the
result of a `down` and the entries of `history`. Code reads their attributes; `to_json()` gives exactly what `--json` prints (the JSON edge).

A row is made from the masked JSON its command built (`of`): the target's records are the previous release's as
much as this one's, so the pieces read from them (a crash record, a diagnosis, the lock) keep the JSON they came
with (`raw`) and expose the fields code reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ShownDiagnosis:
    """A diagnosis as a row shows it (bounded, masked): its signature and summary; `raw` its JSON."""

    signature: str | None
    summary: str
    hint: str | None
    raw: Mapping[str, Any]

    @classmethod
    def of(cls, data: Any) -> ShownDiagnosis | None:
        if not isinstance(data, Mapping):
            return None
        return cls(_opt_str(data.get("signature")), str(data.get("summary") or ""), _opt_str(data.get("hint")),
                   dict(data))

    def to_json(self) -> Json:
        return dict(self.raw)


@dataclass(frozen=True)
class CrashRecord:
    """The supervisor's record of the engine's last crash (state.json's `last_crash`), with why (`diagnosis`)."""

    at: float | None
    exit_code: int | None
    signal: int | None
    signal_name: str | None
    diagnosis: ShownDiagnosis | None
    raw: Mapping[str, Any]

    @classmethod
    def of(cls, data: Any) -> CrashRecord | None:
        if not isinstance(data, Mapping):
            return None
        at = data.get("at")
        return cls(float(at) if isinstance(at, (int, float)) else None, _opt_int(data.get("exit_code")),
                   _opt_int(data.get("signal")), _opt_str(data.get("signal_name")),
                   ShownDiagnosis.of(data.get("diagnosis")), dict(data))

    def to_json(self) -> Json:
        return dict(self.raw)


@dataclass(frozen=True)
class NodeFacts:
    """What a node group's status adds to a node's row: its rank and role, where its health was asked from, its
    last crash diagnosed (`diagnosed`: the key is shown, even when nothing could be said) and whether its crash
    came first."""

    rank: int
    role: str
    health_seen_from: str | None = None
    diagnosed: bool = False
    last_crash_diagnosis: ShownDiagnosis | None = None
    first_crash: bool = False

    def to_json(self) -> Json:
        out: Json = {"node": self.rank, "role": self.role}
        if self.health_seen_from is not None:
            out["health_seen_from"] = self.health_seen_from
        if self.diagnosed:
            out["last_crash_diagnosis"] = None if self.last_crash_diagnosis is None else \
                self.last_crash_diagnosis.to_json()
        out["first_crash"] = self.first_crash
        return out


@dataclass(frozen=True)
class StatusRow:
    """One deployment's `status` on one host."""

    name: str
    host: str
    status: str
    pid: int | None
    uptime_s: float | None
    healthy: bool
    attempt: int | None
    content_hash: str
    run_dir: str
    port: int
    restarts: int
    last_crash: CrashRecord | None
    exit_code: int | None
    signal_name: str | None
    drift: list[str]
    runs: int
    diagnosis: ShownDiagnosis | None
    lock: Json | None
    serving: bool
    node: NodeFacts | None = None
    metrics: Json | None = None          # what the engine serves (deployer.operate.serving; None: not asked / down)
    unhealthy: Json | None = None        # the supervisor's last one-token probe failed (probe): why
    engine: str | None = None            # the run's engine kind, version (as its profile names it) and model
    engine_version: str | None = None
    model: str | None = None
    supervisor: Json | None = None       # a dead or frozen supervisor: {state, summary, next, ...} (None: it watches)
    pulled: Json | None = None           # a fleet's router: the replicas its watch pulled, url -> why (None: none)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> StatusRow:
        """From the row's JSON as describe() built it (masked): every key is there."""
        lock = row["lock"]
        return cls(name=str(row["name"]), host=str(row["host"]), status=str(row["status"]), pid=row["pid"],
                   uptime_s=row["uptime_s"], healthy=bool(row["healthy"]), attempt=row["attempt"],
                   content_hash=str(row["content_hash"] or ""), run_dir=str(row["run_dir"]), port=int(row["port"]),
                   restarts=int(row["restarts"] or 0), last_crash=CrashRecord.of(row["last_crash"]),
                   exit_code=row["exit_code"], signal_name=row["signal_name"],
                   drift=[str(d) for d in row["drift"] or []], runs=int(row["runs"]),
                   diagnosis=ShownDiagnosis.of(row["diagnosis"]),
                   lock=dict(lock) if isinstance(lock, Mapping) else None, serving=bool(row["serving"]),
                   metrics=dict(row["metrics"]) if isinstance(row.get("metrics"), Mapping) else None,
                   unhealthy=dict(row["unhealthy"]) if isinstance(row.get("unhealthy"), Mapping) else None,
                   engine=_opt_str(row.get("engine")), engine_version=_opt_str(row.get("engine_version")),
                   model=_opt_str(row.get("model")),
                   supervisor=dict(row["supervisor"]) if isinstance(row.get("supervisor"), Mapping) else None,
                   pulled=dict(row["pulled"]) if isinstance(row.get("pulled"), Mapping) and row["pulled"] else None)

    @property
    def crash_looping(self) -> bool:
        """The supervisor gave up restarting it: restart.max crashes within restart.window_s."""
        return self.status == "crashloop"

    @property
    def shown_diagnosis(self) -> ShownDiagnosis | None:
        """The diagnosis status shows: the run's own, else its last crash's."""
        return self.diagnosis or (self.last_crash.diagnosis if self.last_crash is not None else None)

    def replace(self, **changes: Any) -> StatusRow:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> Json:
        out: Json = {
            "name": self.name, "host": self.host, "status": self.status, "pid": self.pid, "uptime_s": self.uptime_s,
            "healthy": self.healthy, "attempt": self.attempt, "content_hash": self.content_hash,
            "run_dir": self.run_dir, "port": self.port, "restarts": self.restarts,
            "last_crash": None if self.last_crash is None else self.last_crash.to_json(),
            "exit_code": self.exit_code, "signal_name": self.signal_name, "drift": list(self.drift),
            "runs": self.runs, "diagnosis": None if self.diagnosis is None else self.diagnosis.to_json(),
            "lock": self.lock, "serving": self.serving, "metrics": self.metrics, "unhealthy": self.unhealthy,
            "engine": self.engine, "engine_version": self.engine_version, "model": self.model,
            "supervisor": self.supervisor,
        }
        if self.pulled:  # a fleet's router only, and only while its watch holds a replica out (replicas)
            out["pulled"] = self.pulled
        return {**out, **self.node.to_json()} if self.node is not None else out


@dataclass(frozen=True)
class DownResult:
    """What `down` did on one host: whether the engine was running and the status it left (`absent`: no such
    deployment there, and then no run dir); a node group's rows name their node."""

    name: str
    host: str
    was_running: bool
    status: str | None
    run_dir: str | None = None
    node: int | None = None
    stopped_from: str | None = None    # the state an engine that had ended by itself was in (now stopped)
    on_boot: Any = None                # what became of the boot-time start (the supervisor's answer)

    def to_json(self) -> Json:
        out: Json = {"name": self.name, "host": self.host, "was_running": self.was_running, "status": self.status}
        if self.run_dir is not None:
            out.update(stopped_from=self.stopped_from, on_boot=self.on_boot, run_dir=self.run_dir)
        if self.node is not None:
            out["node"] = self.node
        return out


@dataclass(frozen=True)
class HistoryEntry:
    """One row of `deploy history`: an attempt (its outcome, diagnosis signature, the change made after it) or a
    lock event (a takeover, a break); `raw` is the row's JSON as `--json` prints it (the target's records of any
    release, or the local history's rows)."""

    lock: bool
    started_at: float | None
    outcome: str | None
    detail: str | None = None
    run_id: str = ""
    content_hash: str = ""
    attempt: int | None = None
    current: bool = False
    signature: str = ""
    change: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)
    where: str = ""  # the local history of every deployment (`history --local` without NAME): NAME on HOST

    @classmethod
    def of_attempt(cls, row: Mapping[str, Any]) -> HistoryEntry:
        """An attempt's row (the target's records, or the local history's)."""
        diagnosis = ShownDiagnosis.of(row.get("diagnosis"))
        made = row.get("change")
        change: Mapping[str, Any] = made if isinstance(made, Mapping) else {}
        return cls(lock=False, started_at=row.get("started_at"), outcome=row.get("outcome"),
                   detail=row.get("detail"), run_id=str(row.get("run_id") or ""),
                   content_hash=str(row.get("content_hash") or ""), attempt=row.get("attempt"),
                   current=bool(row.get("current")), signature=str(diagnosis.signature or "") if diagnosis else "",
                   change=str(change.get("reason") or ""), raw=row,
                   where=f"{row['deployment']} on {row.get('host')}" if row.get("deployment") else "")

    @classmethod
    def of_lock(cls, row: Mapping[str, Any]) -> HistoryEntry:
        """A lock event's row (a takeover or a break, from the lock's events)."""
        return cls(lock=True, started_at=row.get("started_at"), outcome=row.get("outcome"),
                   detail=row.get("detail"), raw=row)

    def to_json(self) -> Json:
        return dict(self.raw)
