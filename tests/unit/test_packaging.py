"""`pip install .` (not editable) ships the templates, the supervisor and the engine data files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(REPO)], check=True, timeout=300, capture_output=True)
    return next(out.glob("deployer-*.whl"))


def test_wheel_holds_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("deployer/engines/sglang/launch.sh.j2", "deployer/supervisor/supervise.py",
                   "deployer/supervisor/base.py",
                   "deployer/supervisor/daemon.py", "deployer/supervisor/ports.py",
                   "deployer/supervisor/lease.py",
                   "deployer/engines/sglang/signatures.yaml", "deployer/engines/sglang/renames.yaml",
                   "deployer/engines/vllm/launch.sh.j2", "deployer/engines/vllm/signatures.yaml",
                   "deployer/deployments/fleet/router_launch.sh.j2",
                   "deployer/engines/vllm/probe.py",
                   "deployer/engines/vllm/metrics.yaml", "deployer/engines/sglang/metrics.yaml",
                   "deployer/engines/common/signatures.yaml",
                   "deployer/export/schemas/leaderworkerset-v1.schema.json.gz"):
        assert needed in names, sorted(names)


def test_render_works_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target), "HF_TOKEN": "hf_wheel_secret"}
    probe = subprocess.run([sys.executable, "-c", "import deployer; print(deployer.__file__)"], env=env,
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert probe.stdout.startswith(str(target)), probe.stdout + probe.stderr
    proc = subprocess.run([sys.executable, "-m", "deployer.cli", "render", str(REPO / "profiles/qwen36-mtp.yaml")],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "exec /workspace/venv/bin/python -m sglang.launch_server --model-path Qwen/Qwen3.6-27B" in proc.stdout
    assert "hf_wheel_secret" not in proc.stdout


def test_render_works_from_a_plain_checkout(tmp_path: Path) -> None:
    """A checkout that was never installed (a copy of the tree on PYTHONPATH, no editable finder) renders too."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "deployer", checkout / "deployer", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
            "from deployer.cli.main import main\n"
            "import deployer\n"
            "assert deployer.__file__.startswith(sys.argv[1]), deployer.__file__\n"
            "main(['render', sys.argv[2]])\n")
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_TOKEN": "hf_checkout_secret"}
    proc = subprocess.run([sys.executable, "-c", code, str(checkout), str(REPO / "profiles/qwen36-mtp.yaml")],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "exec /workspace/venv/bin/python -m sglang.launch_server --model-path Qwen/Qwen3.6-27B" in proc.stdout
    assert "hf_checkout_secret" not in proc.stdout
