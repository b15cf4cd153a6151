"""`deploy render` of a multi-node profile: every node's launch script (or, with --json, its argv and masked env),
from the profile alone: node addresses are the hosts as written; the NIC env appears when engine.nic is set
(else `up` finds each node's interface from its facts). Each node's flags are translated for the engine version
its target runs when the local cache knows it (deployer.preflight.known).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from deployer.deployments.nodes.plan import plan_nodes
from deployer.preflight.known import ForTarget, for_target, local_caches
from deployer.profile.model import Profile
from deployer.render.bundle import render


def render_nodes(profile: Profile, as_json: bool, note: Callable[[str], None] | None = None) -> str:
    plans = plan_nodes(profile)
    fits = [for_target(plan.profile, local_caches()) for plan in plans]
    _notes(fits, [plan.label for plan in plans], note)
    if as_json:
        rows = []
        for plan, fit in zip(plans, fits):
            bundle = render(fit.profile)
            rows.append({"node": plan.rank, "host": plan.node.host, "argv": bundle.argv, "env": bundle.masked_env,
                         "script": bundle.script, "content_hash": bundle.content_hash,
                         "engine_version": fit.to_json()})
        return json.dumps({"name": profile.name, "nodes": rows}, indent=1) + "\n"
    parts = []
    for plan, fit in zip(plans, fits):
        nic = "" if profile.engine.nic else "  (NIC env: found per node by `up`)"
        bundle = render(fit.profile)
        env = " ".join(f"{k}={v}" for k, v in bundle.masked_env.items()) or "(none)"
        parts.append(f"# ---- {plan.label}, node_rank {plan.rank} of {len(plans)}{nic}\n# env file: {env}\n"
                     f"{bundle.script}")
    return "\n".join(parts)


def _notes(fits: list[ForTarget], labels: list[str], note: Callable[[str], None] | None) -> None:
    """Each distinct line once; a line that holds for only some nodes names them."""
    if note is None:
        return
    seen: dict[str, list[str]] = {}
    for fit, label in zip(fits, labels):
        for line in fit.notes():
            seen.setdefault(line, []).append(label)
    for line, where in seen.items():
        note(line if len(where) == len(fits) else f"{', '.join(where)}: {line}")
