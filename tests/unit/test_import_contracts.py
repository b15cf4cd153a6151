"""The import contracts of pyproject.toml hold for the tree, and each one fails when its rule is broken."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-logo", "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of the package and the contracts, to break on purpose."""
    shutil.copytree(REPO / "deployer", tmp_path / "deployer", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "importlinter_stdlib.py", tmp_path / "scripts")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_tree_keeps_every_contract() -> None:
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("path, line, contract", [
    ("supervisor/base.py", "import yaml", "imports only the standard library BROKEN"),
    ("supervisor/daemon.py", "from deployer import errors", "imports only the standard library BROKEN"),
    ("profile/model.py", "from deployer.cli import main", "leaves BROKEN"),
    ("remote/base.py", "from deployer.remote import local", "No import cycles between the modules of any package BROKEN"),
    ("engines/vllm/__init__.py", "from deployer.engines.sglang import spec", "No engine package imports another BROKEN"),
    ("cli/export.py", "from deployer.deployments.fleet import members", "shows reports (output) BROKEN"),   # cli-no-kinds
    ("cli/runs.py", "from deployer.deployments.nodes.up import NodeGroupShape", "shows reports (output) BROKEN"),
    # kinds: a fleet and a node group never import each other; the single host imports neither
    ("deployments/fleet/up.py", "from deployer.deployments.nodes import plan", "resolve tells them apart BROKEN"),
    ("deployments/nodes/ops.py", "from deployer.deployments.fleet import members", "resolve tells them apart BROKEN"),
    ("deployments/single/deployment.py", "from deployer.deployments.fleet import report",
     "resolve tells them apart BROKEN"),
    ("deployments/reports.py", "from deployer.deployments.fleet.report import FleetReport",
     "No import cycles between the modules of any package BROKEN"),
    ("stray.py", "import json", "leaves BROKEN"),  # exhaustive: a new top-level module must be placed in a layer
])
def test_a_broken_rule_fails(tree: Path, path: str, line: str, contract: str) -> None:
    target = tree / "deployer" / path
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as f:
        f.write(f"\n{line}\n")
    proc = _lint(tree)
    assert proc.returncode != 0
    assert contract in " ".join(proc.stdout.split()), proc.stdout
