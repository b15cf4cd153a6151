"""A node group (`nodes:`): one engine across several hosts, each node a single-host deployment of the same name.

up / restart go through deployer.deployments.nodes.up (the group is replaced as one); status / down / logs are
this package's `ops`; plan is `dryrun`. `smoke` is the single-host smoke (deployer.smoke:
the same phases, request code, report and JUnit) on the group: up the group, one chat completion through node 0's
port, down. `rollback` goes back to the newest other version that every node ran and that reached ready: node 0's
run record rebuilt the way a single host's is (deployer.operate.rollback.rebuild_profile), put back into the group
profile, and the group `up` with force.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NoReturn

from deployer import smoke as smoke_run
from deployer.deployments.base import Deployment, DownOptions, ExportSource, LogOptions, Out, PruneOptions, Select
from deployer.deployments.reports import (DiagnosisReport, HistoryReport, MemoryPicture, NodeDown, NodeStatus,
                                          PlanReport, PruneReport, plan_error)
from deployer.deployments.single.deployment import Origin, SingleHost
from deployer.errors import NotFound, ProfileError
from deployer.export.prometheus import AddressOf, PromExport, written_address
from deployer.deployments.nodes.scrape import node_targets
from deployer.deployments.nodes import ops as nodes_ops
from deployer.deployments.nodes.dryrun import plan_report
from deployer.deployments.nodes.render import render_nodes
from deployer.deployments.nodes.plan import multinode_of, node_keys, plan_nodes
from deployer.deployments.nodes.up import up_nodes
from deployer.operate.deployment import Ref, layout_of, opened
from deployer.operate.rollback import rebuild_profile
from deployer.runner.up import UpOptions, UpReport
from deployer.profile.model import Profile
from deployer.smoke import SmokeOptions, SmokeReport, Stand
from deployer.box.records import RunView, all_runs
from deployer.events import EventSink
from deployer.prepare.report import PrepareReport
from deployer.runner.install import prepare_all


class NodeGroup(Deployment):
    """One engine across the hosts of `nodes:` (rank 0 serves the API)."""

    def __init__(self, profile: Profile, *, select: Select = Select(), workdir: str | None = None,
                 trust_new_host: bool = False, as_single: SingleHost | None = None) -> None:
        self.profile, self.node = profile, select.node
        self.name: str = profile.name
        self.workdir, self.trust_new_host, self._single = workdir, trust_new_host, as_single

    @property
    def as_single(self) -> SingleHost:
        if self._single is None:
            raise ProfileError(f"{self.name} runs on {len(self.profile.nodes or [])} nodes: this command needs "
                               "one deployment")
        return self._single

    def upgrade(self, opts: object, apply_it: bool, emit: EventSink) -> NoReturn:
        raise ProfileError(f"{self.name}: `deploy upgrade` moves a single host or a replica fleet, not a node group "
                           "(one engine over several hosts): give it the release's engine.python or engine.install "
                           "and `deploy up`")

    def up(self, opts: UpOptions, emit: EventSink) -> UpReport:
        return up_nodes(self.profile, opts, emit)

    def render(self, as_json: bool = False, note: Out | None = None) -> str:
        return render_nodes(self.profile, as_json, note)

    def plan(self, model_config: Path | None = None) -> PlanReport:
        report = plan_report(self.profile, trust_new_host=self.trust_new_host, model_config=model_config)
        return PlanReport(report, report.render_text(), plan_error(report.problems), MemoryPicture.of(report.leader),
                          weights=report.weights)

    def prepare(self, emit: EventSink) -> PrepareReport:
        """Every node's host: each runs the engine from its own environment."""
        members = [(p.node.host, p.label, p.profile) for p in plan_nodes(self.profile)]
        return prepare_all(self.name or self.profile.name, members, self.trust_new_host, emit)

    def status(self) -> NodeStatus:
        return NodeStatus(nodes_ops.status(self.profile, self.node, self.workdir, self.trust_new_host))

    def logs(self, opts: LogOptions, out: Out) -> None:
        nodes_ops.logs(self.profile, self.node, self.workdir, self.trust_new_host, opts, out)

    def member(self, select: Select) -> Deployment:
        if select.node is None:
            return self
        (_, ref), = nodes_ops.node_refs(self.profile, select.node, self.workdir, self.trust_new_host)
        return SingleHost(lambda: ref, origin=Origin(self.name, trust_new_host=self.trust_new_host))

    def history(self) -> HistoryReport:
        return self.as_single.history()

    def diagnose(self, engine_version: str | None = None) -> DiagnosisReport:
        return self.as_single.diagnose(engine_version)

    def down(self, opts: DownOptions = DownOptions()) -> NodeDown:
        return NodeDown(nodes_ops.down(self.profile, self.node, self.workdir, self.trust_new_host, opts))

    def restart(self, opts: UpOptions, emit: EventSink) -> UpReport:
        """Every rank stopped and the group started again as one (a new attempt of the profile's version)."""
        return up_nodes(self.profile, dataclasses.replace(opts, force=True), emit)

    def rollback(self, opts: UpOptions, emit: EventSink) -> UpReport:
        """Back to the newest version, other than the one node 0 runs now, that every node ran and that reached
        ready on every node; NotFound (nothing changed) when there is none."""
        back = self._group_profile_of(self._last_good_group())
        return up_nodes(back, dataclasses.replace(opts, force=True, what="rollback", save_fixed=None), emit)

    def prune(self, opts: PruneOptions = PruneOptions()) -> PruneReport:
        return self.as_single.prune(opts)

    def smoke(self, opts: SmokeOptions, emit: EventSink) -> SmokeReport:
        leader = plan_nodes(self.profile)[0].profile
        stand = Stand(serving=leader, up=up_nodes, stop=self._stop_for_smoke)
        return smoke_run.run(self.profile, opts, emit, stand=stand)

    def export_source(self) -> ExportSource:
        return ExportSource(self.profile)

    def scrape_targets(self, address_of: AddressOf | None = None) -> PromExport:
        return node_targets(self.profile, address_of or written_address)

    # -- the group's versions -------------------------------------------------------------------------------

    def _node_refs(self) -> list[Ref]:
        return [ref for _, ref in nodes_ops.node_refs(self.profile, None, self.workdir, self.trust_new_host)]

    def _runs(self, ref: Ref) -> tuple[list[RunView], str | None]:
        with opened(ref) as (remote, workdir):
            return all_runs(remote, layout_of(workdir, self.name))

    def _last_good_group(self) -> RunView:
        """Node 0's run of the chosen version: the newest whose group attempt (up_id, attempt) every node ran
        and that stayed up on every node (records.RunView.stayed_up: not one that crash-looped after ready), with
        another content hash than node 0's current run."""
        refs = self._node_refs()
        leader_views, current_id = self._runs(refs[0])
        current = next((v for v in leader_views if v.run.run_id == current_id), None)
        skip = current.content_hash if current else None
        ready_elsewhere = [{_attempt_key(v) for v in self._runs(ref)[0] if v.stayed_up} for ref in refs[1:]]
        for view in reversed(leader_views):
            key = _attempt_key(view)
            if view.stayed_up and view.content_hash != skip and key[0] and \
                    all(key in keys for keys in ready_elsewhere):
                return view
        raise NotFound(f"{self.name}: no other version ever reached ready on every node; nothing to go back to")

    def _group_profile_of(self, view: RunView) -> Profile:
        """The group profile of node 0's run: its engine (real secret values restored) without the per-node
        values nodes: sets, in the profile's nodes as given now."""
        ref = self._node_refs()[0]
        with opened(ref) as (remote, workdir):
            single = rebuild_profile(remote, view, ref, workdir)
        multinode = multinode_of(self.profile)
        now = self.profile.engine
        args = {k: v for k, v in single.engine.args.items() if k not in node_keys(multinode)}
        env = {k: v for k, v in single.engine.env.items() if k not in multinode.nic_env or k in now.env}
        first = (self.profile.nodes or [])[0]
        update: dict[str, Any] = {"args": args, "env": env,
                                  "port": now.port if first.engine_port else single.engine.port,
                                  "gpus": now.gpus if first.gpus is not None else single.engine.gpus}
        back = self.profile.with_engine(single.engine.model_copy(update=update))
        back._secret_env, back._secret_args = single._secret_env, single._secret_args
        back._templates = {**self.profile._templates, **single._templates}
        return back

    def _stop_for_smoke(self, opts: SmokeOptions) -> dict[str, Any]:
        results = nodes_ops.down(self.profile, None, self.workdir, opts.trust_new_host, DownOptions())
        return {"was_running": any(r.was_running for r in results),
                "status": results[0].status if results else None}


def _attempt_key(view: RunView) -> tuple[str, int]:
    """Which group attempt a node's run belongs to: every node of one attempt records the same up_id and
    attempt."""
    return str(view.record.get("up_id") or ""), int(view.record.get("attempt") or 0)
