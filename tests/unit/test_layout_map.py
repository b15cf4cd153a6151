"""scripts/layout_map.py rewrites a branch's imports across the layout moves (docs/layout-map.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("layout_map", Path(__file__).parents[2] / "scripts" / "layout_map.py")
assert _SPEC is not None and _SPEC.loader is not None
layout_map = importlib.util.module_from_spec(_SPEC)
sys.modules["layout_map"] = layout_map
_SPEC.loader.exec_module(layout_map)


@pytest.mark.parametrize(("old", "new"), [
    # moved twice: issue 23 put the node group in deployer.nodes, issue 38 under deployments/
    ("from deployer.fleet.nodes_plan import plan_nodes\n", "from deployer.deployments.nodes.plan import plan_nodes\n"),
    ("from deployer.fleet.router import metrics_port\n", "from deployer.deployments.fleet.router import metrics_port\n"),
    # the old front module is now a package: its class lives in `deployment`
    ("from deployer.deployments.fleet import ReplicaFleet\n",
     "from deployer.deployments.fleet.deployment import ReplicaFleet\n"),
    ("from deployer.deployments import nodes as kind\n", "from deployer.deployments.nodes import deployment as kind\n"),
    # already the new form: a module of the new package stays as written
    ("from deployer.deployments.fleet import scrape\n", "from deployer.deployments.fleet import scrape\n"),
    ("from deployer.deployments.nodes.plan import host_port\n", "from deployer.host import host_port\n"),
    # what this machine knows, in deployer.local; TargetSpec in the leaf deployer.host
    ("from deployer import local_history\n", "from deployer.local import history as local_history\n"),
    ("from deployer.settings import KEYS, load_config\n", "from deployer.local.settings import KEYS, load_config\n"),
    ("from deployer.oncall.known import workdirs_on\n", "from deployer.local.lookup import workdirs_on\n"),
    ("from deployer.remote.base import Remote, TargetSpec\n",
     "from deployer.remote.base import Remote\nfrom deployer.host import TargetSpec\n"),
])
def test_an_old_import_is_rewritten_to_where_the_module_is_now(old: str, new: str) -> None:
    assert layout_map.rewrite(old) == new
    assert layout_map.rewrite(new) == new


def test_every_new_module_exists() -> None:
    missing = [new for new in layout_map.MOVES.values()
               if not layout_map._is_module(layout_map._new(new)) and not new.startswith("deployer.cli.")]
    assert missing == []
