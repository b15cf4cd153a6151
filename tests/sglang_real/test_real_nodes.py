"""One engine across nodes against real SGLang 0.5.23: every node's rendered launch (its --nnodes, --node-rank,
--dist-init-addr, --host) is accepted by the real parser and resolved to what deployer meant, node by node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployer.deployments.nodes.plan import NodeNet, plan_nodes
from deployer.preflight.checks import run_preflight
from deployer.profile.loader import load_profile
from deployer.remote.base import Remote
from sglang_release import ROOT, only_release

MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3-next-80b-a3b"
pytestmark = only_release("0.5.23")


def test_every_nodes_launch_resolves_as_rendered(h200_host: Any, remote: Remote, tmp_path: Path) -> None:
    target = h200_host.target(tmp_path / "work")
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps({
        "name": "realnodes",   # both nodes on the one test host: each needs its own workdir
        "nodes": [{**target}, {**h200_host.target(tmp_path / "work1"), "engine_port": 30001}],
        "engine": {"python": "sglang-python", "model_path": str(MODEL), "dist_init_port": 20000,
                   "args": {"device": "cuda", "tp_size": 2, "max_total_tokens": 8192}}}))
    plans = plan_nodes(load_profile(path), [NodeNet("10.0.0.10", "ens5"), NodeNet("10.0.0.11", "ens6")])
    for plan in plans:
        report = run_preflight(remote, plan.profile, cache_dir=tmp_path / "cache")
        assert report.rejection is None and report.resolution == "done", (plan.rank, report.resolution)
        resolved = report.resolved or {}
        assert (resolved["nnodes"], resolved["node_rank"], resolved["dist_init_addr"]) == \
            (2, plan.rank, "10.0.0.10:20000")
        assert resolved["host"] == ("127.0.0.1" if plan.rank == 0 else "10.0.0.11")
        assert resolved["port"] == (30000 if plan.rank == 0 else 30001)
