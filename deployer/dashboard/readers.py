"""Typed status rows and fleet members, and the CLI's `--json` outputs, read into the dashboard's typed values:
what a real `DashboardSource` needs when the Deployment interface hands it the same data the CLI prints (issue 27:
the page is a view, not a source).

- `row_of_status`: one typed status row (operate/rows.py `StatusRow`, what `deploy status --json` prints from) ->
  `OverviewRow`: every field status shows (state, engine and version, model, pid, uptime, restarts, crash loop,
  last crash and its diagnosis, lock holder, serving metrics).
- `row_of_member`: one member of a fleet's status (deployments/reports.py `FleetMember`: its place and its typed
  row, or none when absent or unreachable) -> `OverviewRow`.
- `attempts_from_history`: `deploy history --json` (newest first, lock takeovers among them) -> attempts, oldest
  first.
- `memory_from_plan`: `deploy plan --json`'s `memory` block and `facts.gpus` -> one `GpuMemory` per GPU.
- `drift_from_lines`: the drift lines outcome.json and `status --json` store (diagnose/drift.py `Drift.describe`)
  -> `Drift` rows, for a source that has only those lines and not the typed `Drift.to_json`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from deployer.dashboard.model import Attempt, Diagnosis, Drift, GpuMemory, LastCrash, OverviewRow
from deployer.deployments.reports import FleetMember
from deployer.operate.rows import StatusRow

MIB = 1 << 20
# diagnose/drift.py Drift.describe: "asked F=V, engine resolved R" and "asked F=V, but the engine does not report F
# (unknown to the engine)"; the values are as _show prints them (true/false, None, JSON for lists and dicts).
_CHANGED = re.compile(r"^asked (?P<flag>[^=\s]+)=(?P<asked>.*), engine resolved (?P<resolved>.*)$")
_UNKNOWN = re.compile(r"^asked (?P<flag>[^=\s]+)=(?P<asked>.*), but the engine does not report (?P=flag) "
                      r"\(unknown to the engine\)$")


def row_of_status(status: StatusRow, key: str, *, kind: str = "deployment", member: str | None = None,
                  engine: str | None = None, version: str | None = None) -> OverviewRow:
    """One typed status row as the overview and the page show it; a node's row is kind `node`, its rank the member.
    `engine`/`version`: what the profile names, for a row whose record names none."""
    if status.node is not None:
        kind, member = "node", str(status.node.rank)
    diagnosis = status.shown_diagnosis or (status.node.last_crash_diagnosis if status.node is not None else None)
    crash = status.last_crash
    return OverviewRow(
        key=key, name=status.name, host=status.host, status=status.status, serving=status.serving,
        healthy=status.healthy, kind=kind, engine=status.engine or engine,
        engine_version=status.engine_version or version, model=status.model, pid=status.pid,
        uptime_s=status.uptime_s, restarts=status.restarts, crash_loop=status.crash_looping,
        last_crash=None if crash is None or not crash.raw else LastCrash(crash.at, crash.exit_code, crash.signal_name),
        diagnosis=None if diagnosis is None or not diagnosis.raw else Diagnosis.from_json(diagnosis.raw),
        lock=_lock_text(status.lock), unhealthy=None if status.unhealthy is None else
        str(status.unhealthy.get("reason") or "no token from the one-token probe"),
        attempt=status.attempt, content_hash=status.content_hash or None, run_dir=status.run_dir or None,
        port=status.port or None, member=member, **serving_of(status.metrics))


def _lock_text(lock: Mapping[str, Any] | None) -> str | None:
    """Who holds the lock, as status says it (box/lock.py `describe_lease`)."""
    return None if not lock else str(lock.get("text") or "locked")


def row_of_member(member: FleetMember, key: str, *, engine: str | None = None,
                  version: str | None = None) -> OverviewRow:
    """A fleet member's row: its typed status row as any other's (kind: its role, member: its tag); a member with
    none (absent, unreachable) shows its place and its state."""
    if member.row is not None:
        return row_of_status(member.row, key, kind=member.role, member=member.tag, engine=engine, version=version)
    return OverviewRow(key=key, name=member.name, host=member.host, status=member.status, kind=member.role,
                       member=member.tag, engine=engine, engine_version=version)


def serving_of(metrics: Any) -> dict[str, Any]:
    """A status row's `metrics` (deployer.operate.serving: absent numbers None) as the overview's columns:
    requests running + waiting, generation tokens/s, KV cache %, end-to-end p99 in ms."""
    if not isinstance(metrics, Mapping):
        return {}
    running, waiting = metrics.get("requests_running"), metrics.get("requests_waiting")
    kv, e2e = metrics.get("kv_cache_usage"), metrics.get("e2e_latency")
    p99 = e2e.get("p99_s") if isinstance(e2e, Mapping) else None
    return {"requests": None if running is None and waiting is None else int((running or 0) + (waiting or 0)),
            "tokens_per_s": metrics.get("generation_tokens_per_s"),
            "kv_usage_pct": None if kv is None else round(float(kv) * 100, 1),
            "p99_latency_ms": None if p99 is None else round(float(p99) * 1000, 1)}


def attempts_from_history(rows: Sequence[Mapping[str, Any]]) -> list[Attempt]:
    """`deploy history --json` as the timeline's attempts, oldest first (the lock's rows left out)."""
    return [Attempt.from_json(row) for row in reversed(rows) if row.get("kind", "attempt") == "attempt"]


def with_phases(attempt: Attempt, phases: Sequence[Mapping[str, Any]]) -> Attempt:
    """The attempt with the phases its watch saw (the `phase` events: phase, elapsed)."""
    return Attempt.from_json({**attempt.to_json(), "phases": list(phases)}) if phases else attempt


def memory_from_plan(memory: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] = ()) -> list[GpuMemory]:
    """`deploy plan --json`'s `memory` block (whichever engine's memory model made it: KV tokens x bytes per token
    and Mamba slots, or KV, CUDA graph, activation and non-torch estimates) as one `GpuMemory` per GPU of
    `facts.gpus` (index, name, total_mib); one GPU when the facts name none. Each part sums the fields present.
    A plan that carries its own per-GPU `budget` (deployer's plan since the memory picture) is read from that."""
    budget = memory.get("budget")
    if isinstance(budget, list) and budget:   # `deploy plan`'s own per-GPU budget (what its bars draw)
        return [GpuMemory(gpu=int(b.get("gpu", i)), name=None if b.get("name") is None else str(b["name"]),
                          total_mib=float(b.get("total_mib") or 0), weights_mib=float(b.get("weights_mib") or 0),
                          kv_mib=float(b.get("kv_cache_mib") or 0), mamba_mib=float(b.get("mamba_state_mib") or 0),
                          other_mib=float(b.get("activations_graphs_mib") or 0), fits=bool(memory.get("fits", True)))
                for i, b in enumerate(budget) if isinstance(b, Mapping)]
    kv = float(memory.get("kv_memory_mib") or 0.0) or \
        float(memory.get("kv_tokens") or 0) * float(memory.get("kv_cell_bytes") or 0) / MIB
    mamba = float(memory.get("mamba_state_bytes") or 0) * float(memory.get("mamba_slots") or 0) / MIB
    other = sum(float(memory.get(k) or 0.0) for k in ("activation_mib", "non_torch_mib", "reserved_mib"))
    listed = list(gpus) or [{"index": 0}]
    return [GpuMemory(gpu=int(g.get("index", i)), name=None if g.get("name") is None else str(g["name"]),
                      total_mib=float(g.get("total_mib") or memory.get("gpu_total_mib") or 0),
                      weights_mib=float(memory.get("weights_per_gpu_mib") or 0.0), kv_mib=kv, mamba_mib=mamba,
                      graphs_mib=float(memory.get("cuda_graph_mib") or 0.0), other_mib=other,
                      fits=bool(memory.get("fits", True)))
            for i, g in enumerate(listed)]


def drift_from_lines(lines: Sequence[str]) -> list[Drift]:
    """The drift lines as rows (values as the line shows them); a line of another form is kept whole as the flag."""
    out = []
    for line in lines:
        changed, unknown = _CHANGED.match(line), _UNKNOWN.match(line)
        if unknown:
            out.append(Drift(flag=unknown["flag"], asked=unknown["asked"], kind="unknown"))
        elif changed:
            out.append(Drift(flag=changed["flag"], asked=changed["asked"], resolved=changed["resolved"]))
        else:
            out.append(Drift(flag=line, asked=None, kind="other"))
    return out
