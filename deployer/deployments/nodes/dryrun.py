"""`deploy plan` of one engine across nodes: everything `up` checks before it changes anything, and nothing else.

Every node is connected (concurrently, no lock: nothing is written), the network decided, node 0's single-host
preflight run on its derived profile (flags, effective args, memory), and the cross-node checks made
(deployments/nodes/checks.py). The report is node 0's preflight plus one line per node and the group's problems.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import PreflightFailed
from deployer.deployments.nodes.checks import compare, dist_init_problems, network
from deployer.deployments.nodes.plan import NodePlan, multinode_of, plan_nodes
from deployer.runner.fanout import at_once
from deployer.deployments.nodes.watch import NodeSession
from deployer.local.history import home
from deployer.preflight.checks import PreflightReport, run_preflight
from deployer.preflight.facts import Facts, gather_facts
from deployer.prepare.environment import EnvPrepared
from deployer.profile.model import Profile
from deployer.prepare.pushed import WeightsNeeded
from deployer.runner.install import engine_download_note, launched_from, merged_weights, plan_environment, \
    planned_weights, unbuilt_problem
from deployer.box.push import layout_for
from deployer.remote.connect import conversing, target_spec
from deployer.box.records import current_view


@dataclass
class NodesPlanReport:
    leader: PreflightReport | None
    nodes: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    environment: EnvPrepared | None = None      # engine.install: what up would install (resolved on node 0)
    weights: list[WeightsNeeded] = field(default_factory=list)   # engine.weights: what the fetch would take, per node
    notes: list[str] = field(default_factory=list)   # said once for the group (the engine's own download)

    def to_json(self) -> dict[str, Any]:
        data = {"node0": self.leader.to_json() if self.leader else None, "nodes": self.nodes,
                "problems": self.problems}
        return data if self.environment is None else {**data, "environment": self.environment.to_json()}

    def render_text(self) -> str:
        lines = self.environment.lines() if self.environment is not None else []
        lines += [w.describe() for w in self.weights]
        lines += self.notes
        lines += [self.leader.render_text().rstrip()] if self.leader else []
        lines.append("nodes:")
        for n in self.nodes:
            nic = n["nic"] or "(NCCL/Gloo choose)"
            lines.append(f"  node {n['node']} {n['host']}: address {n['addr']}, nic {nic}, port {n['port']}, "
                         f"{n['engine']} {n['version'] or '?'}, {n['gpus']} GPU(s)")
        lines += [f"problem: {p}" for p in self.problems]
        return "\n".join(lines) + "\n"


def plan_report(profile: Profile, *, trust_new_host: bool, model_config: Path | None) -> NodesPlanReport:
    plans = plan_nodes(profile)
    with _connected(plans, trust_new_host) as sessions:
        report = NodesPlanReport(leader=None)
        try:
            nets = network(sessions, profile)
        except PreflightFailed as exc:
            report.problems = exc.problems
            return report
        if profile.engine.install is not None:  # resolved and checked on node 0; nothing built
            launched, report.environment = plan_environment(sessions[0].remote, sessions[0].plan.profile)
            profile = launched_from(profile, launched.engine.python)
        plans = plan_nodes(profile, nets)
        for s, plan in zip(sessions, plans):
            s.plan = plan
        report.leader = run_preflight(sessions[0].remote, plans[0].profile, cache_dir=home() / "cache",
                                      model_config=model_config, own_port=_own_port(sessions[0]))
        facts = at_once(lambda s: gather_facts(s.remote, s.plan.profile), sessions)
        report.nodes = [_row(p, f) for p, f in zip(plans, facts)]
        report.notes = engine_download_note(profile)   # every node's engine downloads it: said once
        report.weights, weights_problems = merged_weights(at_once(lambda s: planned_weights(s.remote, s.plan.profile),
                                                                  sessions))
        report.problems = [*report.leader.problems, *compare(sessions, plans, facts, False),
                           *dist_init_problems(sessions, plans), *weights_problems]
        if report.environment is not None:  # "not installed" only says the environment is not built yet
            for holder in (report, report.leader):
                holder.problems = [p for p in holder.problems
                                   if not unbuilt_problem(p, plans[0].profile, report.environment)]
        return report


def _own_port(s: NodeSession) -> bool:
    return s.serving is not None and s.serving.record.get("port") == s.plan.port


def _row(plan: NodePlan, facts: Facts) -> dict[str, Any]:
    names = multinode_of(plan.profile).nic_env
    nic = plan.profile.engine.env.get(names[0]) if names else None
    gpus = plan.profile.engine.gpus
    return {"node": plan.rank, "host": plan.node.host, "addr": plan.addr, "nic": nic, "port": plan.port,
            "engine": plan.profile.engine.kind, "version": facts.engine_version,
            "gpus": len(gpus) if gpus is not None else len(facts.gpus)}


@contextlib.contextmanager
def _connected(plans: list[NodePlan], trust_new_host: bool) -> Any:
    talks = contextlib.ExitStack()

    def open_one(plan: NodePlan) -> NodeSession:
        remote = talks.enter_context(conversing(target_spec(plan.profile, trust_new_host)))  # the helper's requests
        layout = layout_for(remote, plan.profile)
        view = current_view(remote, layout)
        return NodeSession(plan=plan, remote=remote, layout=layout,
                           serving=view if view is not None and view.alive else None)

    try:
        yield at_once(open_one, plans)
    finally:
        talks.close()
