"""`deploy render` of a multi-node profile: every node's launch script (or, with --json, its argv and masked env),
from the profile alone: node addresses are the hosts as written; the NIC env appears when engine.nic is set
(else `up` finds each node's interface from its facts).
"""

from __future__ import annotations

import json

from deployer.nodes.plan import plan_nodes
from deployer.profile.model import Profile
from deployer.render.bundle import render


def render_nodes(profile: Profile, as_json: bool) -> str:
    plans = plan_nodes(profile)
    if as_json:
        rows = []
        for plan in plans:
            bundle = render(plan.profile)
            rows.append({"node": plan.rank, "host": plan.node.host, "argv": bundle.argv, "env": bundle.masked_env,
                         "script": bundle.script, "content_hash": bundle.content_hash})
        return json.dumps({"name": profile.name, "nodes": rows}, indent=1) + "\n"
    parts = []
    for plan in plans:
        nic = "" if profile.engine.nic else "  (NIC env: found per node by `up`)"
        bundle = render(plan.profile)
        env = " ".join(f"{k}={v}" for k, v in bundle.masked_env.items()) or "(none)"
        parts.append(f"# ---- {plan.label}, node_rank {plan.rank} of {len(plans)}{nic}\n# env file: {env}\n"
                     f"{bundle.script}")
    return "\n".join(parts)
