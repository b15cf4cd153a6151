"""The canary's decisions in history: on the router's host beside the fleet's record
(`<workdir>/<fleet>/rollouts.jsonl`, one JSON object a line, the newest last, at most KEEP lines) and in this
machine's local history (an event of kind `canary`, deployer.local.history).

Each entry is one decision with its numbers: the verdict (promote / roll back, every gate with the canary's and
the others' numbers) and the rollout's end (which replicas run the new version, whether the canary's previous
version serves again). Writing never fails the rollout: a failure is a warning.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from deployer.errors import DeployError, NotFound
from deployer.deployments.fleet.canary_judge import Verdict
from deployer.deployments.fleet.record import record_path
from deployer.local.history import History
from deployer.remote.base import Remote
from deployer.box.push import expand_workdir, make_owned_dirs

ROLLOUTS = "rollouts.jsonl"
KEEP = 200
READ_MAX = 4 << 20


def rollouts_path(workdir: str, name: str) -> str:
    return record_path(workdir, name).rsplit("/", 1)[0] + "/" + ROLLOUTS


def verdict_entry(fleet: str, verdict: Verdict | None, problem: str | None, canary: int) -> dict[str, Any]:
    """The canary's verdict as history keeps it (`problem`: why there is no verdict, e.g. no metrics)."""
    data: dict[str, Any] = {"at": time.time(), "fleet": fleet, "kind": "canary-verdict", "canary": canary}
    if verdict is None:
        return {**data, "decision": "roll-back", "reasons": [problem or "no numbers"], "numbers": None}
    return {**data, "decision": verdict.decision, "reasons": verdict.reasons, "window_s": verdict.window_s,
            "numbers": {"canary": dataclasses.asdict(verdict.canary),
                        "baseline": [dataclasses.asdict(b) for b in verdict.baseline],
                        "checks": [dataclasses.asdict(c) for c in verdict.checks]}}


def end_entry(fleet: str, decision: str, replicas: dict[int, str], notes: list[str]) -> dict[str, Any]:
    """How the rollout ended: `decision` promoted | rolled-back | stopped, each replica's status."""
    return {"at": time.time(), "fleet": fleet, "kind": "rollout-end", "decision": decision,
            "replicas": {f"r{i}": s for i, s in sorted(replicas.items())}, "notes": list(notes)}


def record(remote: Remote, workdir: str, fleet: str, entry: dict[str, Any], local: bool) -> str | None:
    """Append `entry` on the router's host (and to the local history when `local`); a warning text on failure."""
    problem = None
    try:
        path = rollouts_path(expand_workdir(remote, workdir), fleet)
        folder = path.rsplit("/", 1)[0]
        make_owned_dirs(remote, folder, folder)
        lines = _lines(remote, path)[-(KEEP - 1):] + [json.dumps(entry, sort_keys=True)]
        remote.put(("\n".join(lines) + "\n").encode(), path, 0o644)
    except DeployError as exc:
        problem = f"the canary's decision was not written on {remote.label}: {exc.message}"
    if local:
        store = History()
        try:
            store.event(fleet, "canary", entry)
        finally:
            store.close()
    return problem


def read_rollouts(remote: Remote, workdir: str, fleet: str) -> list[dict[str, Any]]:
    """Every kept entry of the fleet on this host, oldest first ([] when none was written)."""
    out = []
    for line in _lines(remote, rollouts_path(expand_workdir(remote, workdir), fleet)):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _lines(remote: Remote, path: str) -> list[str]:
    try:
        raw = remote.read(path, 0, READ_MAX)
    except NotFound:
        return []
    return [line for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]
