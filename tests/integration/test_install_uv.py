"""`engine.install` built with uv on a target whose build python has no pip at all (a venv made --without-pip, as
python3-venv without python3-pip leaves one): uv resolves the spec first (`uv pip compile`), so the compatibility
preflight still sees what would be installed and refuses a torch the driver cannot run before anything is built;
`plan` lists the resolved packages; `prepare` builds the environment with uv. uv is the real binary from PyPI
(UV_VENV, `make uv-venv`), on the private test sshd's PATH only."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import STANDIN, deploy, events
from install_helpers import PACKAGE, TORCH_CU128, cuda_mismatch, envs, install_profile, make_wheel, \
    refused_for_cuda

pytestmark = pytest.mark.integration

UV_VENV = Path(os.environ.get("UV_VENV", Path.home() / ".cache" / "deployer" / "uv-venv"))


@pytest.fixture()
def uv_sshd(fresh_sshd: Any) -> Any:
    """A private sshd whose sessions have the real uv and the stand-in nvidia-smi on their PATH."""
    uv = UV_VENV / "bin" / "uv"
    if not uv.exists():
        pytest.fail(f"no uv in {UV_VENV}: run `make uv-venv` (README's `make test` builds it)")
    (fresh_sshd.bin_dir / "uv").symlink_to(uv)
    (fresh_sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN / "bin" / "nvidia-smi")
    return fresh_sshd


def without_pip(folder: Path) -> str:
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    assert subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True).returncode != 0
    return str(python)


def test_a_python_without_pip_is_resolved_by_uv_then_built_with_it(tmp_path: Path, uv_sshd: Any) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    home, work = tmp_path / "home", tmp_path / "work"
    prof = install_profile(tmp_path, uv_sshd, wheels, "1.0", name="uvdemo", python=without_pip(tmp_path / "nopip"))
    plan = deploy("plan", str(prof), home=home, timeout=300)
    assert f"{PACKAGE}==1.0" in plan.stdout and "would be built with uv" in plan.stdout, plan.stdout + plan.stderr
    assert envs(work) == {}
    prep = deploy("prepare", str(prof), "--json", home=home, timeout=300)
    assert prep.returncode == 0, prep.stderr[-3000:] + prep.stdout[-3000:]
    row = events(prep.stdout)[-1]["environments"][0]
    assert row["built"] is True and row["tool"].startswith("uv 0.13"), row
    (digest, _), = envs(work).items()
    record = json.loads((work / ".deployer" / "envs" / digest / "deployer-env.json").read_text())
    assert record["tool"].startswith("uv ") and {"name": PACKAGE, "version": "1.0"}.items() <= \
        next(d for d in record["resolved"] if d["name"] == PACKAGE).items()


def test_a_torch_the_driver_cannot_run_is_refused_though_the_python_has_no_pip(tmp_path: Path,
                                                                               uv_sshd: Any) -> None:
    wheels, env = cuda_mismatch(tmp_path)
    home, work = tmp_path / "home", tmp_path / "work"
    prof = install_profile(tmp_path, uv_sshd, wheels, "", name="uvcuda", packages=[TORCH_CU128], env=env,
                           python=without_pip(tmp_path / "nopip"))
    up = deploy("up", str(prof), home=home, timeout=300)
    assert up.returncode == 4 and "Traceback" not in up.stderr and refused_for_cuda(up.stderr), up.stderr[-3000:]
    assert not (work / ".deployer" / "envs").exists() and not (work / "uvcuda" / "current").exists()
